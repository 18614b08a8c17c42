// Per-window inference time of the standalone graph in this browser (`neurofed bench web` drives it).
// Query: build=wasm|jsep|webgpu|all (which onnxruntime-web bundle: ort.wasm.min.js, ort.min.js, ort.webgpu.min.js,
// ort.all.min.js), ep=wasm|webgpu|webnn (comma list: fallbacks, e.g. webgpu,wasm), threads=N (WASM threads; > 1 needs cross-origin isolation), opt=all|
// extended|basic|disabled (graph optimisation), model=data/model.onnx, reps=300, warmup=20.
// Windows: the bundle's recording (data/recording.*), decoded in order with a carried state, restarted per pass.
// Result: window.bench (p50/p90/p99 ms, probabilities of the first pass, environment) or window.bench.error.
import { StandaloneDecoder, recordingWindows } from "./neurofed.mjs";

const p = new URLSearchParams(location.search);
const BUILDS = { wasm: "ort.wasm.min.js", jsep: "ort.min.js", webgpu: "ort.webgpu.min.js", all: "ort.all.min.js" };
const cfg = {
  build: p.get("build") ?? "wasm", ep: p.get("ep") ?? "wasm", threads: Number(p.get("threads") ?? "1"),
  opt: p.get("opt") ?? "all", model: p.get("model") ?? "data/model.onnx", reps: Number(p.get("reps") ?? "300"),
  warmup: Number(p.get("warmup") ?? "20"),
};

function load(src) {
  return new Promise((resolve, reject) => {
    const s = document.createElement("script");
    s.src = src;
    s.onload = resolve;
    s.onerror = () => reject(new Error(`cannot load ${src}`));
    document.head.append(s);
  });
}

let env = {};
const q = (xs, f) => xs[Math.min(xs.length - 1, Math.floor(f * xs.length))];

async function main() {
  const dist = "node_modules/onnxruntime-web/dist/";
  await load(dist + BUILDS[cfg.build]);
  ort.env.wasm.numThreads = cfg.threads;
  ort.env.wasm.wasmPaths = new URL(dist, location.href).href;
  env = {
    crossOriginIsolated: self.crossOriginIsolated, hardwareConcurrency: navigator.hardwareConcurrency,
    userAgent: navigator.userAgent, webgpu: "gpu" in navigator, webnn: "ml" in navigator,
  };
  if (env.webgpu) {
    const a = await navigator.gpu.requestAdapter().catch(() => null);
    env.webgpuAdapter = a ? (a.info ? `${a.info.vendor} ${a.info.architecture} ${a.info.description}`.trim() || "yes" : "yes") : null;
  }
  const meta = await (await fetch("data/model.json")).json();
  const doc = await (await fetch("data/recording.json")).json();
  const windows = recordingWindows(doc, new Uint8Array(await (await fetch("data/recording.bin")).arrayBuffer()));
  const model = new Uint8Array(await (await fetch(cfg.model)).arrayBuffer());
  const t0 = performance.now();
  const dec = await StandaloneDecoder.create(ort, model, meta, cfg.ep.split(","), { graphOptimizationLevel: cfg.opt,
    intraOpNumThreads: cfg.threads });
  const loadMs = performance.now() - t0;
  let state = dec.initialState();
  const ms = [];
  const probs = [];
  for (let i = 0; i < cfg.warmup + cfg.reps; i++) {
    const k = i % windows.length;
    if (k === 0) state = dec.initialState();
    const a = performance.now();
    const out = await dec.run(windows[k], state);
    const b = performance.now();
    state = out.state;
    if (i >= cfg.warmup) ms.push(b - a);
    if (i < windows.length) probs.push(Array.from(out.probs));
  }
  const s = [...ms].sort((x, y) => x - y);
  window.bench = { ...cfg, ...env, load_ms: loadMs, n: ms.length, p50_ms: q(s, 0.5), p90_ms: q(s, 0.9),
    p99_ms: q(s, 0.99), mean_ms: ms.reduce((x, y) => x + y, 0) / ms.length, ms, probs };
  document.getElementById("out").textContent = JSON.stringify({ ...window.bench, ms: undefined, probs: undefined }, null, 1);
}

main().catch((err) => {
  window.bench = { ...cfg, ...env, error: err.message ?? String(err) };
  document.getElementById("out").textContent = `error: ${window.bench.error}`;
});
