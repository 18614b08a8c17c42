#!/usr/bin/env node
// Live decoding in Node: the same loop as the browser page (apps/web/live.mjs), from the bridge of
// `neurofed app serve --stream NAME`: the model and the bridge's address come from that server, every window
// the bridge forwards is decoded here with onnxruntime-node; prints each prediction and the running accuracy.
//   node apps/node/live.mjs --server http://127.0.0.1:8765 [--windows N] [--seconds S] [--json out.json] [--keep]
//                           [--public-key release.pub]
// --public-key: the server's model must be a signed release (data/model.onnx.sig, docs/security.md) verified
// against this key, which the app holds itself (like a CA certificate); otherwise it is refused.
// Ends after N windows, S seconds, or when the bridge closes; --json writes every result (--keep: with the
// window's samples, base64) plus the accuracy and latency quantiles. Errors: one line, exit 2.
import { readFileSync, writeFileSync } from "node:fs";
import * as ort from "onnxruntime-node";
import WebSocket from "ws";
import { LiveSession, NeurofedError, StandaloneDecoder, importReleaseKey, verifyRelease } from "../web/neurofed.mjs";

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : fallback;
}

async function fetchOk(url, kind) {
  let r;
  try {
    r = await fetch(url);
  } catch (err) {
    throw new NeurofedError(`cannot reach ${url} (${err.cause?.code ?? err.message}): is \`neurofed app serve --stream\` running?`);
  }
  if (!r.ok) throw new NeurofedError(`${url}: HTTP ${r.status} (${kind})`);
  return r;
}

async function main() {
  const server = arg("server", "http://127.0.0.1:8765").replace(/\/$/, "");
  const maxWindows = Number(arg("windows", "0"));
  const seconds = Number(arg("seconds", "0"));
  const meta = await (await fetchOk(`${server}/data/model.json`, "model metadata")).json();
  const model = new Uint8Array(await (await fetchOk(`${server}/data/model.onnx`, "model")).arrayBuffer());
  const pub = arg("public-key");
  if (pub) {
    const key = await importReleaseKey(readFileSync(pub, "utf8"));
    const sig = await fetch(`${server}/data/model.onnx.sig`).catch(() => null);
    if (!sig?.ok) throw new NeurofedError(`${server} serves no model signature (an unsigned model is refused with --public-key)`);
    const h = await verifyRelease(model, await sig.text(), key, meta);
    console.log(`release ${h.version} verified (sha256 ${h.sha256.slice(0, 12)}…)`);
  }
  const url = arg("ws") ?? (await (await fetchOk(`${server}/data/live.json`, "bridge address")).json()).ws;
  const dec = await StandaloneDecoder.create(ort, model, meta, ["cpu"]);
  const ws = new WebSocket(url);
  let fatal = null;
  const finished = new Promise((resolve) => {
    const live = new LiveSession(dec, {
      send: (t) => ws.readyState === WebSocket.OPEN && ws.send(t),
      keepWindows: process.argv.includes("--keep"),
      onHello: (h) => console.log(`live: ${h.stream.name} (${h.stream.n_channels} ch @ ${h.stream.rate} Hz, ${h.mode})`),
      onStatus: ({ level, message }) => {
        console.error(`${level}: ${message}`);
        if (level === "error") {
          fatal = fatal ?? message;
          ws.close();
        }
      },
      onResult: (r, s) => {
        if (r.rejected) console.log(`window ${r.seq}: rejected (${r.rejected})`);
        else {
          const acc = s.accuracy === null ? "" : `, accuracy ${(100 * s.accuracy).toFixed(1)} %`;
          console.log(`window ${r.seq}: ${r.pred_label} (${r.probs.map((v) => v.toFixed(3)).join(" ")})` +
            `${r.label ? `, cue ${r.label}` : ""}${acc}, latency ${r.latency_ms.toFixed(1)} ms`);
        }
        if (maxWindows && s.results.length >= maxWindows) ws.close();
      },
    });
    ws.on("message", (data, isBinary) => live.handle(isBinary ? "<binary>" : data.toString()));
    ws.on("error", (err) => { fatal = fatal ?? `cannot reach the bridge at ${url} (${err.message})`; });
    ws.on("close", () => live.chain.then(() => resolve(live)));
    if (seconds) setTimeout(() => ws.close(), seconds * 1000);
  });
  const live = await finished;
  if (fatal) throw new NeurofedError(fatal);
  const out = {
    results: live.results,
    accuracy: live.accuracy,
    scored: live.scored,
    rejected: live.rejected,
    latency_ms_p50: live.quantile("latency_ms", 0.5),
    latency_ms_p99: live.quantile("latency_ms", 0.99),
    infer_ms_p50: live.quantile("infer_ms", 0.5),
  };
  console.log(`done: ${live.results.length} windows, accuracy ${out.accuracy === null ? "-" : (100 * out.accuracy).toFixed(1) + " %"}, ` +
    `latency p50 ${out.latency_ms_p50?.toFixed(1)} ms, inference p50 ${out.infer_ms_p50?.toFixed(2)} ms (onnxruntime-node, 1 thread)`);
  const path = arg("json");
  if (path) writeFileSync(path, JSON.stringify(out));
}

main().catch((err) => {
  console.error(`error: ${err.message}`);
  process.exit(2);
});
