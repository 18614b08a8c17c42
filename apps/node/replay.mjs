#!/usr/bin/env node
// Replay a NeuroFed app bundle (model.onnx, model.json, recording.bin/.json) through the
// standalone decoder with onnxruntime-node: prints each window's prediction and the running
// accuracy; --json FILE writes every window's probabilities. With --public-key PEM the model must be a signed
// release (DIR/model.onnx.sig, docs/security.md) verified against that key before it is loaded.
//   node apps/node/replay.mjs --bundle DIR [--json out.json] [--public-key release.pub]
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import * as ort from "onnxruntime-node";
import { NeurofedError, StandaloneDecoder, importReleaseKey, recordingWindows, verifyRelease } from "../web/neurofed.mjs";

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
  if (pub) {
    const sigPath = join(dir, "model.onnx.sig");
    if (!existsSync(sigPath)) throw new NeurofedError(`${sigPath}: no signature (an unsigned model is refused with --public-key)`);
    const h = await verifyRelease(model, readFileSync(sigPath, "utf8"), await importReleaseKey(readFileSync(pub, "utf8")), meta);
    console.log(`release ${h.version} verified (sha256 ${h.sha256.slice(0, 12)}…)`);
  }
  const dec = await StandaloneDecoder.create(ort, new Uint8Array(model), meta, ["cpu"]);
  dec.checkStream(doc);
  const windows = recordingWindows(doc, readFileSync(join(dir, "recording.bin")));
  let state = dec.initialState();
  const probs = [];
  const ms = [];
  let correct = 0;
  for (const [i, w] of windows.entries()) {
    const t0 = performance.now();
    const out = await dec.run(w, state);
    ms.push(performance.now() - t0);
    state = out.state;
    const p = Array.from(out.probs);
    probs.push(p);
    const k = p.indexOf(Math.max(...p));
    correct += k === doc.labels[i];
    console.log(
      `window ${i + 1}/${windows.length}: ${meta.classes[k]} (${p.map((v) => v.toFixed(3)).join(" ")}), ` +
        `cue ${doc.classes[doc.labels[i]]}, accuracy ${((100 * correct) / (i + 1)).toFixed(1)} %`,
    );
  }
  ms.sort((a, b) => a - b);
  const p50 = ms[Math.floor(ms.length / 2)];
  console.log(`p50 ${p50.toFixed(3)} ms per window (onnxruntime-node, 1 thread)`);
  const out = arg("json");
  if (out) writeFileSync(out, JSON.stringify({ probs, accuracy: correct / windows.length, p50_ms: p50 }));
}

main().catch((err) => {
  console.error(`error: ${err.message}`);
  process.exit(2);
});
