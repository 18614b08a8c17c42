#!/usr/bin/env node
// Replay a NeuroFed app bundle (model.onnx, model.json, recording.bin/.json) through the
// standalone decoder with onnxruntime-node: prints each window's prediction and the running
// accuracy; --json FILE writes every window's probabilities. With --public-key PEM the model must be a signed
// release (DIR/model.onnx.sig, docs/security.md) verified against that key before it is loaded. With --follow the
// app also subscribes to the federation's release topic (--broker mqtt://host:port, --federation NAME) and swaps to
// every newer signed release between two windows (the session's alignment and BN context carried); a forged, older
// or incompatible release is refused in one line and the decoder keeps its model. --interval-ms paces the windows.
//   node apps/node/replay.mjs --bundle DIR [--json out.json] [--public-key release.pub]
//                             [--follow --broker mqtt://127.0.0.1:1883 --federation F] [--interval-ms 0]
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import * as ort from "onnxruntime-node";
import {
  NeurofedError, ReleaseFollower, StandaloneDecoder, importReleaseKey, recordingWindows, releaseTopic, verifyRelease,
} from "../web/neurofed.mjs";

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : fallback;
}

async function main() {
  const dir = arg("bundle");
  if (!dir) throw new NeurofedError("usage: replay.mjs --bundle DIR [--json out.json] [--public-key release.pub]");
  const meta = JSON.parse(readFileSync(join(dir, "model.json"), "utf8"));
  const doc = JSON.parse(readFileSync(join(dir, "recording.json"), "utf8"));
  const model = readFileSync(join(dir, "model.onnx"));
  const pub = arg("public-key");
  const follow = process.argv.includes("--follow");
  let key = null;
  let version = null;
  if (pub) {
    const sigPath = join(dir, "model.onnx.sig");
    if (!existsSync(sigPath)) throw new NeurofedError(`${sigPath}: no signature (an unsigned model is refused with --public-key)`);
    key = await importReleaseKey(readFileSync(pub, "utf8"));
    const h = await verifyRelease(model, readFileSync(sigPath, "utf8"), key, meta);
    version = h.version;
    console.log(`release ${h.version} verified (sha256 ${h.sha256.slice(0, 12)}…)`);
  }
  let dec = await StandaloneDecoder.create(ort, new Uint8Array(model), meta, ["cpu"]);
  dec.checkStream(doc);
  const windows = recordingWindows(doc, readFileSync(join(dir, "recording.bin")));
  const { follower, client } = follow ? await subscribe(key, dec, version) : {};
  const interval = Number(arg("interval-ms", "0"));
  let state = dec.initialState();
  const recent = [];
  const probs = [];
  const versions = [];
  const ms = [];
  let correct = 0;
  try {
    for (const [i, w] of windows.entries()) {
      if (follower) {  // between two windows: the previous one is out, this one not yet in
        const sw = await follower.swapIfPending(dec, state, recent);
        if (sw) {
          ({ dec, state } = sw);
          console.log(`swapped to release ${sw.swap.version} (was ${sw.swap.previous}): ${sw.swap.ea_windows_carried} ` +
            `EA windows carried, BN context ${sw.swap.context_carried ? "carried" : "restarted"}`);
        }
      }
      const t0 = performance.now();
      const out = await dec.run(w, state);
      ms.push(performance.now() - t0);
      state = out.state;
      recent.push(w);
      if (recent.length > dec.sa.context_windows) recent.shift();
      const p = Array.from(out.probs);
      probs.push(p);
      versions.push(follower ? follower.version : version);
      const k = p.indexOf(Math.max(...p));
      correct += k === doc.labels[i];
      console.log(
        `window ${i + 1}/${windows.length}: ${meta.classes[k]} (${p.map((v) => v.toFixed(3)).join(" ")}), ` +
          `cue ${doc.classes[doc.labels[i]]}, accuracy ${((100 * correct) / (i + 1)).toFixed(1)} %` +
          (follower ? `, release ${follower.version}` : ""),
      );
      if (interval) await new Promise((r) => setTimeout(r, interval));
    }
  } finally {
    client?.end(true);
  }
  ms.sort((a, b) => a - b);
  const p50 = ms[Math.floor(ms.length / 2)];
  console.log(`p50 ${p50.toFixed(3)} ms per window (onnxruntime-node, 1 thread)`);
  const out = arg("json");
  const followed = follower ? { versions, swaps: follower.swaps, refused: follower.refused, accepted: follower.accepted } : {};
  if (out) writeFileSync(out, JSON.stringify({ probs, accuracy: correct / windows.length, p50_ms: p50, ...followed }));
}

/** --follow: subscribe to the release topic; resolves once subscribed (the retained release is then on its way). */
async function subscribe(key, dec, version) {
  const broker = arg("broker");
  const federation = arg("federation");
  if (!key || !broker || !federation) {
    throw new NeurofedError("--follow needs --public-key (the federation's release key), --broker and --federation");
  }
  const { default: mqtt } = await import("mqtt");  // only with --follow
  const follower = new ReleaseFollower(ort, key, {
    version, current: dec,
    onRefused: (line) => console.error(`warning: release refused, decoder keeps its model: ${line}`),
    onAccepted: (p) => console.log(`release ${p.version} verified; swapping at the next window`),
  });
  const topic = releaseTopic(federation);
  const client = mqtt.connect(broker, { clientId: `neurofed-node-follow-${process.pid}`, reconnectPeriod: 1000,
    connectTimeout: 10_000 });
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new NeurofedError(`cannot reach the MQTT broker at ${broker} within 10 s`)), 10_000);
    client.once("connect", () => client.subscribe(topic, { qos: 1 }, (err) => {
      clearTimeout(timer);
      if (err) reject(new NeurofedError(`cannot subscribe to ${topic} at ${broker} (${err.message})`));
      else resolve();
    }));
    client.once("error", (err) => { clearTimeout(timer); reject(new NeurofedError(`MQTT broker ${broker}: ${err.message}`)); });
  }).catch((err) => { client.end(true); throw err; });
  client.on("message", (t, payload) => { if (t === topic && payload.length) follower.offer(new Uint8Array(payload), t); });
  return { follower, client };
}

main().catch((err) => {
  console.error(`error: ${err.message}`);
  process.exit(2);
});
