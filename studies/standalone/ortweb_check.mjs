// node ortweb_check.mjs GRAPH.onnx FEEDS_DIR N_CHANNELS  (see ortweb_check.py)
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
const web = fileURLToPath(new URL("../../apps/web/node_modules/onnxruntime-web/dist/ort.node.min.mjs", import.meta.url));
const ort = await import(web);
ort.env.wasm.numThreads = 1;
const [graph, dir, nch] = process.argv.slice(2);
const read = (f, T) => { const b = readFileSync(`${dir}/${f}`); return new T(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength)); };
const w = read("window.f32", Float32Array), s = read("state.f64", Float64Array);
const want = read("probs.f32", Float32Array), wantNext = read("next.f64", Float64Array);
const c = Number(nch);
const sess = await ort.InferenceSession.create(readFileSync(graph), { executionProviders: ["wasm"] });
const feeds = () => ({ window: new ort.Tensor("float32", w, [c, w.length / c]), state: new ort.Tensor("float64", s, [s.length]) });
const out = await sess.run(feeds());
let dp = 0, dn = 0, sc = 0;
out.probs.data.forEach((v, i) => { dp = Math.max(dp, Math.abs(v - want[i])); });
out.next_state.data.forEach((v, i) => { dn = Math.max(dn, Math.abs(v - wantNext[i])); sc = Math.max(sc, Math.abs(wantNext[i])); });
const t0 = performance.now();
for (let i = 0; i < 30; i++) await sess.run(feeds());
console.log(`onnxruntime-web ${ort.env.versions.web} (WASM, 1 thread): max |dprob| ${dp.toExponential(2)}, ` +
  `max |dnext_state| ${dn.toExponential(2)} (of ${sc.toExponential(2)}), ${((performance.now() - t0) / 30).toFixed(1)} ms/run`);
