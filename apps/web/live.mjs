// Live decoding in the browser: the bridge of `neurofed app serve --stream NAME` forwards a LSL EEG stream and
// its cues over a WebSocket; every window is decoded here with onnxruntime-web (neurofed.mjs's LiveSession).
// Query: ?ws=ws://host:port (default: data/live.json), threads=1, keep=1 (keep each window for tests).
// Results: window.neurofed (results, accuracy, status, error, release: the verified release header or null).
// A server started with --public-key serves data/release.pub: the model must then be a release signed by that key.
import { LiveSession, NeurofedError, StandaloneDecoder, importReleaseKey, verifyRelease } from "./neurofed.mjs";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const EEG_SECONDS = 5;
const state = { results: [], status: [], error: null, connected: false, closed: false, session: null, release: null };
window.neurofed = state;

async function fetchOk(url, kind) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status} (${kind}; start the page with \`neurofed app serve --stream NAME\`)`);
  return r;
}

function drawBars(classes, probs) {
  $("bars").innerHTML = classes
    .map((c, i) => `<div class="row"><span class="label">${c}</span><div class="bar"><div class="fill" style="width:${(100 * probs[i]).toFixed(1)}%"></div></div><span class="val">${probs[i].toFixed(3)}</span></div>`)
    .join("");
}

/** A few channels' last EEG_SECONDS, scrolling (sensorimotor ones first). */
class Scope {
  constructor(canvas, chNames, rate) {
    this.canvas = canvas;
    const prefer = ["C3", "Cz", "C4", "FCz"];
    const lower = chNames.map((c) => c.toLowerCase());
    this.idx = prefer.map((p) => lower.indexOf(p.toLowerCase())).filter((i) => i >= 0);
    if (this.idx.length < 3) this.idx = chNames.slice(0, 4).map((_, i) => i);
    this.names = this.idx.map((i) => chNames[i]);
    this.nCh = chNames.length;
    this.len = Math.round(EEG_SECONDS * rate);
    this.buf = this.idx.map(() => new Float32Array(this.len));
    this.pos = 0;
    this.dirty = false;
    const tick = () => {
      if (this.dirty) this.draw();
      requestAnimationFrame(tick);
    };
    requestAnimationFrame(tick);
  }

  push(samples, n) {  // samples: n x nCh, sample-major
    for (let s = 0; s < n; s++) {
      const p = (this.pos + s) % this.len;
      this.idx.forEach((c, k) => { this.buf[k][p] = samples[s * this.nCh + c]; });
    }
    this.pos = (this.pos + n) % this.len;
    this.dirty = true;
  }

  draw() {
    this.dirty = false;
    const { canvas } = this;
    const g = canvas.getContext("2d");
    const W = canvas.width, H = canvas.height, rows = this.buf.length, h = H / rows;
    g.clearRect(0, 0, W, H);
    g.font = "11px system-ui";
    this.buf.forEach((b, k) => {
      let m = 1e-6;
      for (const v of b) m = Math.max(m, Math.abs(v));
      const mid = h * (k + 0.5);
      g.strokeStyle = "#3b7dd8";
      g.beginPath();
      for (let x = 0; x < this.len; x++) {
        const v = b[(this.pos + x) % this.len];
        const px = (x / (this.len - 1)) * W, py = mid - (v / m) * (h * 0.45);
        x ? g.lineTo(px, py) : g.moveTo(px, py);
      }
      g.stroke();
      g.fillStyle = "#555";
      g.fillText(`${this.names[k]} ±${m.toFixed(0)} µV`, 4, h * k + 12);
    });
  }
}

function showStatus({ level, message }) {
  state.status.push({ level, message });
  if (level === "error") {
    state.error = state.error ?? message;
    $("error").textContent = `error: ${message}`;
  } else {
    $("status").className = level === "warning" ? "warning" : "muted";
    $("status").textContent = message;
  }
}

async function main() {
  ort.env.wasm.numThreads = Number(params.get("threads") ?? "1");
  ort.env.wasm.wasmPaths = new URL("node_modules/onnxruntime-web/dist/", location.href).href;
  const meta = await (await fetchOk("data/model.json", "model metadata")).json();
  const model = new Uint8Array(await (await fetchOk("data/model.onnx", "model")).arrayBuffer());
  // `neurofed app serve --public-key K` serves K as data/release.pub: the model must then be a release signed by it
  const pub = await fetch("data/release.pub");
  let release = null;
  if (pub.ok) {
    const sig = await fetch("data/model.onnx.sig");
    if (!sig.ok) throw new NeurofedError("the server gives a release key but no model signature: unsigned model refused");
    release = await verifyRelease(model, await sig.text(), await importReleaseKey(await pub.text()), meta);
  }
  state.release = release;
  const url = params.get("ws") ?? (await (await fetchOk("data/live.json", "bridge address")).json()).ws;
  const dec = await StandaloneDecoder.create(ort, model, meta, ["wasm"]);
  const sa = meta.standalone;
  $("model").textContent =
    `${meta.model} (${meta.bn_mode}, ${meta.strategy || "?"}), model hash ${meta.model_hash.slice(0, 12)}…; ` +
    `${meta.n_channels} channels at ${sa.rate} Hz (${sa.unit}), ${sa.window_samples}-sample windows` +
    (release ? `; signed release ${release.version}, verified` : "");
  drawBars(meta.classes, meta.classes.map(() => 0));
  let scope = null;
  const ws = new WebSocket(url);
  const live = new LiveSession(dec, {
    send: (t) => ws.readyState === WebSocket.OPEN && ws.send(t),
    keepWindows: params.get("keep") === "1",
    onHello: (h) => {
      scope = new Scope($("eeg"), h.stream.ch_names, h.stream.rate);
      $("stream").textContent = `live: ${h.stream.name} (${h.stream.source_id}), ${h.stream.n_channels} channels at ` +
        `${h.stream.rate} Hz, ${h.mode} windows` + (h.mode === "sliding" ? ` every ${h.step_s} s` : " at each cue");
    },
    onEeg: (msg, samples) => scope?.push(samples, msg.n),
    onCue: (msg) => { if (msg.opens) $("cue").textContent = msg.label; },
    onStatus: showStatus,
    onResult: (r, s) => {
      state.results.push(r);
      $("s-window").textContent = `${s.results.length}`;
      $("s-rej").textContent = `${s.rejected}`;
      if (r.rejected) {
        showStatus({ level: "warning", message: `window ${r.seq} rejected: ${r.rejected}` });
        return;
      }
      drawBars(meta.classes, r.probs);
      $("word").textContent = r.pred_label.replaceAll("_", " ");
      $("word").className = r.correct === undefined ? "" : r.correct ? "right" : "wrong";
      if (r.label) $("cue").textContent = r.label;
      state.accuracy = s.accuracy;
      if (s.accuracy !== null) $("s-acc").textContent = `${(100 * s.accuracy).toFixed(1)} % (${s.scored})`;
      $("s-lat").textContent = `${s.quantile("latency_ms", 0.5).toFixed(1)} ms`;
      $("s-inf").textContent = `${s.quantile("infer_ms", 0.5).toFixed(1)} ms`;
      const colour = r.correct === undefined ? "#999" : r.correct ? "#2e9d4f" : "#d33";
      $("history").insertAdjacentHTML("beforeend", `<span title="${r.pred_label}" style="background:${colour}"></span>`);
    },
  });
  state.session = live;
  ws.onopen = () => { state.connected = true; };
  ws.onmessage = (ev) => live.handle(ev.data);
  ws.onerror = () => showStatus({ level: "error", message: `cannot reach the bridge at ${url}` });
  ws.onclose = (ev) => {
    state.closed = true;
    if (state.connected) showStatus({ level: "warning", message: `the bridge closed the connection (code ${ev.code})` });
  };
}

main().catch((err) => showStatus({ level: "error", message: err.message }));
