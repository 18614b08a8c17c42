// Replays a recording exported by `neurofed app bundle` through the standalone model in
// onnxruntime-web (WASM, 1 thread) in real time; shows live probabilities and running accuracy.
// Query: ?data=data&speed=1 (speed 0 = as fast as possible). Results: window.neurofed.
import { StandaloneDecoder, recordingWindows } from "./neurofed.mjs";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const base = params.get("data") ?? "data";
const speed = Number(params.get("speed") ?? "1");
const state = { results: [], ms: [], done: false, error: null, decoder: null };
window.neurofed = state;

async function fetchOk(url, kind) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status} (${kind}; write it with \`neurofed app bundle\`)`);
  return r;
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

function drawBars(classes, probs) {
  $("bars").innerHTML = classes
    .map((c, i) => `<div class="row"><span class="label">${c}</span><div class="bar"><div class="fill" style="width:${(100 * probs[i]).toFixed(1)}%"></div></div><span class="val">${probs[i].toFixed(3)}</span></div>`)
    .join("");
}

async function main() {
  ort.env.wasm.numThreads = 1;
  ort.env.wasm.wasmPaths = new URL("node_modules/onnxruntime-web/dist/", location.href).href;
  const meta = await (await fetchOk(`${base}/model.json`, "model metadata")).json();
  const doc = await (await fetchOk(`${base}/recording.json`, "recording")).json();
  const bytes = new Uint8Array(await (await fetchOk(`${base}/recording.bin`, "recording")).arrayBuffer());
  const model = new Uint8Array(await (await fetchOk(`${base}/model.onnx`, "model")).arrayBuffer());
  const dec = await StandaloneDecoder.create(ort, model, meta, ["wasm"]);
  state.decoder = dec;
  dec.checkStream(doc);
  const windows = recordingWindows(doc, bytes);
  state.windows = windows;
  const sa = meta.standalone;
  $("model").textContent =
    `${meta.model} (${meta.bn_mode}, ${meta.strategy || "?"}), model hash ${meta.model_hash.slice(0, 12)}…; ` +
    `${meta.n_channels} channels at ${sa.rate} Hz (${sa.unit}), ${sa.window_samples}-sample windows; ` +
    `recording ${doc.sessions.map((s) => s.file).join(", ")} (${windows.length} cues)`;
  drawBars(meta.classes, meta.classes.map(() => 0));
  let s = dec.initialState();
  let correct = 0;
  const t0 = performance.now();
  const windowS = sa.window_samples / sa.rate;
  for (const [i, w] of windows.entries()) {
    if (speed > 0) {  // real time: window i is complete (i + 1) window lengths after the start
      const due = t0 + ((i + 1) * windowS * 1000) / speed;
      await new Promise((r) => setTimeout(r, Math.max(0, due - performance.now())));
    }
    const a = performance.now();
    const out = await dec.run(w, s);
    state.ms.push(performance.now() - a);
    s = out.state;
    const p = Array.from(out.probs);
    const k = p.indexOf(Math.max(...p));
    const ok = k === doc.labels[i];
    correct += ok;
    state.results.push({ index: i, probs: p, pred: k, label: doc.labels[i] });
    drawBars(meta.classes, p);
    $("s-window").textContent = `${i + 1} / ${windows.length}`;
    $("s-cue").textContent = doc.classes[doc.labels[i]];
    $("s-acc").textContent = `${((100 * correct) / (i + 1)).toFixed(1)} %`;
    $("s-p50").textContent = `${median(state.ms).toFixed(2)} ms`;
    $("history").insertAdjacentHTML("beforeend", `<span title="${meta.classes[k]}" style="background:${ok ? "#2e9d4f" : "#d33"}"></span>`);
  }
  state.p50_ms = median(state.ms);
  state.accuracy = correct / windows.length;
  state.done = true;
  $("status").textContent = `done: ${windows.length} windows, accuracy ${(100 * state.accuracy).toFixed(1)} %`;
}

main().catch((err) => {
  state.error = err.message;
  state.done = true;
  $("error").textContent = `error: ${err.message}`;
});
