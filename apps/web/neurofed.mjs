// NeuroFed standalone decoder for JavaScript: one implementation for the browser (onnxruntime-web)
// and Node (onnxruntime-node). The whole decoding loop is
//     const dec = await StandaloneDecoder.create(ort, modelBytes, meta);
//     let state = dec.initialState();
//     ({ probs, state } = await dec.run(window, state));   // per window
// The graph itself does the guard, band-pass, resampling, Euclidean alignment and BN context;
// this file only checks inputs and turns the graph's guard flags into a clear error.

export const GUARD_KINDS = ["non-finite", "flat", "saturated"];

/** A problem with the input an app passed (wrong shape, rate, unit, foreign state). */
export class NeurofedError extends Error {
  constructor(message) {
    super(message);
    this.name = "NeurofedError";
  }
}

/** The input guard refused a window; the state is unchanged. `badChannels` maps kind -> channel names. */
export class WindowRejected extends NeurofedError {
  constructor(message, badChannels) {
    super(message);
    this.name = "WindowRejected";
    this.badChannels = badChannels;
  }
}

/** One line naming the rejected channels, from the graph's (3, channels) guard output. */
export function guardReason(flags, chNames) {
  const n = chNames.length;
  const bad = {};
  const parts = [];
  GUARD_KINDS.forEach((kind, k) => {
    const chs = chNames.filter((_, i) => flags[k * n + i] > 0);
    if (chs.length) {
      bad[kind] = chs;
      parts.push(`${kind} channel${chs.length > 1 ? "s" : ""} ${chs.join(", ")}`);
    }
  });
  return [parts.join("; "), bad];
}

export class StandaloneDecoder {
  /**
   * @param ort onnxruntime-web or onnxruntime-node module
   * @param session an ort.InferenceSession of the standalone graph
   * @param meta the model's NeuroFed metadata (model.json written by `neurofed app bundle`)
   */
  constructor(ort, session, meta) {
    if (!meta || !meta.standalone) {
      throw new NeurofedError("not a standalone model: export it with `neurofed export --standalone`");
    }
    this.ort = ort;
    this.session = session;
    this.meta = meta;
    this.sa = meta.standalone;
    this.nCh = meta.n_channels;
    this.nSamples = this.sa.window_samples;
  }

  /**
   * Load a model (URL, path or bytes) with its metadata; one intra-op thread unless `options` say otherwise.
   * Graph optimisation: "extended" in WASM (onnxruntime-web's "all" made this graph ~2x slower per window,
   * docs/benchmarks/web.md), "all" natively (onnxruntime-node).
   */
  static async create(ort, model, meta, executionProviders, options = {}) {
    const wasm = (executionProviders ?? []).some((ep) => (ep.name ?? ep) === "wasm");
    const session = await ort.InferenceSession.create(model, {
      executionProviders,
      graphOptimizationLevel: wasm ? "extended" : "all",
      intraOpNumThreads: 1,
      ...options,
    });
    return new StandaloneDecoder(ort, session, meta);
  }

  /** The state before a session's first window: zeros with the model hash. */
  initialState() {
    const s = new Float64Array(this.sa.state_size);
    s.set(this.sa.hash_words, 0);
    return s;
  }

  /** Refuse a stream this model cannot decode (channels, rate, unit). */
  checkStream({ ch_names, rate, unit }) {
    const want = this.meta.ch_names;
    if (ch_names.length !== want.length || ch_names.some((c, i) => c.toLowerCase() !== want[i].toLowerCase())) {
      throw new NeurofedError(`stream channels [${ch_names.join(", ")}] are not the model's [${want.join(", ")}] in order`);
    }
    if (Math.abs(rate - this.sa.rate) > 1e-9) {
      throw new NeurofedError(`stream rate ${rate} Hz, but this model was exported for ${this.sa.rate} Hz`);
    }
    if (unit !== this.sa.unit) {
      throw new NeurofedError(`stream unit ${unit}, but this model expects ${this.sa.unit}`);
    }
  }

  /** Throw a NeurofedError naming the problem if the window or the state cannot be fed. */
  check(window, state) {
    const want = this.nCh * this.nSamples;
    if (!(window instanceof Float32Array) || window.length !== want) {
      const got = window instanceof Float32Array ? `${window.length} samples` : `a ${window?.constructor?.name}`;
      throw new NeurofedError(
        `window is ${got}, expected a Float32Array of ${this.nCh} channels x ${this.nSamples} samples ` +
          `(${this.nSamples / this.sa.rate} s at ${this.sa.rate} Hz, ${this.sa.unit}) = ${want}`,
      );
    }
    if (!(state instanceof Float64Array) || state.length !== this.sa.state_size) {
      throw new NeurofedError(`state must be a Float64Array of ${this.sa.state_size} values (use initialState())`);
    }
    for (let i = 0; i < this.sa.hash_words.length; i++) {
      if (state[i] !== this.sa.hash_words[i]) {
        throw new NeurofedError(
          `state belongs to another model (hash words ${Array.from(state.slice(0, 4))}, ` +
            `this model ${this.sa.hash_words}); start from initialState()`,
        );
      }
    }
  }

  /** Decode one raw window: `{probs, state}`; throws WindowRejected if the guard refuses it. */
  async run(window, state) {
    this.check(window, state);
    const T = this.ort.Tensor;
    const out = await this.session.run({
      window: new T("float32", window, [this.nCh, this.nSamples]),
      state: new T("float64", state, [this.sa.state_size]),
    });
    const flags = out.guard.data;
    if (flags.some((v) => v > 0)) {
      const [reason, bad] = guardReason(flags, this.meta.ch_names);
      throw new WindowRejected(reason, bad);
    }
    return { probs: Float32Array.from(out.probs.data), state: out.next_state.data };
  }
}

/** Split a recording (recording.json + the bytes of recording.bin) into float32 windows. */
export function recordingWindows(doc, bytes) {
  const [n, c, t] = doc.shape;
  if (bytes.byteLength !== 4 * n * c * t) {
    throw new NeurofedError(`recording.bin has ${bytes.byteLength} bytes, expected 4 x ${n} x ${c} x ${t}`);
  }
  const all = new Float32Array(bytes.buffer ?? bytes, bytes.byteOffset ?? 0, n * c * t);
  return Array.from({ length: n }, (_, i) => all.slice(i * c * t, (i + 1) * c * t));
}

/** Float32Array of base64-encoded float32 little-endian bytes (the bridge's arrays). */
export function base64Floats(b64) {
  let bytes;
  if (typeof Buffer !== "undefined") {
    bytes = new Uint8Array(Buffer.from(b64, "base64"));  // a copy: aligned, own buffer
  } else {
    const s = atob(b64);
    bytes = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) bytes[i] = s.charCodeAt(i);
  }
  return new Float32Array(bytes.buffer, 0, bytes.length >> 2);
}

/** Milliseconds since the Unix epoch with sub-millisecond resolution (browser and Node). */
export function nowUnixMs() {
  return performance.timeOrigin + performance.now();
}

export const LIVE_PROTOCOL = "neurofed-live/1";

/**
 * The app side of `neurofed app serve --stream` (the bridge, protocol neurofed-live/1): decodes the bridge's
 * windows in order with one carried state, keeps running accuracy against the cues and the latency from each
 * window's last sample reaching the bridge to its prediction here. One implementation for the page and Node.
 *
 *     const live = new LiveSession(dec, { send: (t) => ws.send(t), onResult, onEeg, onCue, onStatus });
 *     ws.onmessage = (ev) => live.handle(ev.data);
 */
export class LiveSession {
  constructor(dec, { send = null, onHello = null, onEeg = null, onCue = null, onResult = null, onStatus = null,
    keepWindows = false } = {}) {
    this.dec = dec;
    this.cb = { send, onHello, onEeg, onCue, onResult, onStatus };
    this.keepWindows = keepWindows;
    this.results = [];
    this.hello = null;
    this.state = null;
    this.fatal = null;
    this.correct = 0;
    this.scored = 0;
    this.rejected = 0;
    this.chain = Promise.resolve();
    this.classes = dec.meta.classes.map((c) => c.toLowerCase());
  }

  status(level, message) {
    if (level === "error") this.fatal = this.fatal ?? message;
    this.cb.onStatus?.({ level, message });
  }

  /** One message of the bridge (a JSON text). Never throws: problems become status messages. */
  handle(text) {
    let msg;
    try {
      msg = JSON.parse(text);
    } catch {
      this.status("warning", `the bridge sent a message that is not JSON (${String(text).slice(0, 40)}); ignored`);
      return;
    }
    try {
      if (msg.type === "hello") this.onHello(msg);
      else if (msg.type === "window") this.chain = this.chain.then(() => this.decode(msg));
      else if (msg.type === "eeg") this.cb.onEeg?.(msg, base64Floats(msg.data));
      else if (msg.type === "cue") this.cb.onCue?.(msg);
      else if (msg.type === "status") this.status(msg.level, msg.message);
      else this.status("warning", `unknown message type ${JSON.stringify(msg.type)} from the bridge; ignored`);
    } catch (err) {
      this.status("error", err.message);
    }
  }

  onHello(msg) {
    if (msg.protocol !== LIVE_PROTOCOL) {
      throw new NeurofedError(`the bridge speaks ${msg.protocol}, this app ${LIVE_PROTOCOL}: update one of them`);
    }
    this.dec.checkStream({ ch_names: msg.stream.ch_names, rate: msg.stream.rate, unit: msg.stream.unit });
    if (msg.window_samples !== this.dec.nSamples) {
      throw new NeurofedError(`the bridge cuts ${msg.window_samples}-sample windows, the model takes ${this.dec.nSamples}`);
    }
    this.hello = msg;
    this.state = this.dec.initialState();
    // one throw-away run before the first window: the first run of a session compiles/allocates (~200 ms in WASM)
    const warm = new Float32Array(this.dec.nCh * this.dec.nSamples).map((_, i) => Math.sin(i));
    this.chain = this.chain.then(() => this.dec.run(warm, this.dec.initialState())).catch(() => {});
    this.cb.onHello?.(msg);
  }

  async decode(msg) {
    if (this.fatal || !this.state) return;
    const received = nowUnixMs();
    let w;
    try {
      w = base64Floats(msg.data);
    } catch {
      this.status("warning", `window ${msg.seq}: its samples are not base64; skipped`);
      return;
    }
    const res = { seq: msg.seq, t_end: msg.t_end, label: msg.label ?? "" };
    if (this.keepWindows) res.window_b64 = msg.data;
    const t0 = performance.now();
    let out;
    try {
      out = await this.dec.run(w, this.state);
    } catch (err) {
      if (!(err instanceof WindowRejected)) {
        this.status("error", `window ${msg.seq}: ${err.message}`);
        return;
      }
      this.rejected += 1;
      res.rejected = err.message;
      this.results.push(res);
      this.cb.onResult?.(res, this);
      return;
    }
    const done = nowUnixMs();
    this.state = out.state;
    const probs = Array.from(out.probs);
    const pred = probs.indexOf(Math.max(...probs));
    Object.assign(res, {
      probs, pred, pred_label: this.dec.meta.classes[pred],
      infer_ms: performance.now() - t0,
      queue_ms: done - received - (performance.now() - t0),
      latency_ms: done - msg.arrival_unix * 1000,
    });
    const cue = this.classes.indexOf(res.label.toLowerCase());
    if (cue >= 0) {
      this.scored += 1;
      res.correct = cue === pred;
      this.correct += res.correct;
    }
    this.results.push(res);
    this.cb.send?.(JSON.stringify({ type: "prediction", seq: res.seq, pred, probs, latency_ms: res.latency_ms }));
    this.cb.onResult?.(res, this);
  }

  /** Running accuracy against the cues (null before the first cue-locked window). */
  get accuracy() {
    return this.scored ? this.correct / this.scored : null;
  }

  /** The q-quantile (0..1) of a field over the predictions. */
  quantile(field, q) {
    const xs = this.results.filter((r) => r[field] !== undefined).map((r) => r[field]).sort((a, b) => a - b);
    return xs.length ? xs[Math.min(xs.length - 1, Math.floor(q * xs.length))] : null;
  }
}

// ----------------------------------------------------------------------------- signed releases
// The JavaScript half of neurofed_runtime.release (runtime/neurofed_runtime/release.py, docs/security.md): a
// release is the standalone ONNX file and a detached signature document MODEL.onnx.sig,
//   {"header": {"format": "neurofed-release/1", "version", "parent", "created", "sha256", "size", "model_hash", ...},
//    "signature": "<base64 Ed25519 signature of SIGNED_PREFIX + the header's canonical JSON>"}
// verified with WebCrypto's Ed25519 (browsers and Node >= 20) against the federation's public key (PEM, SPKI).

export const RELEASE_FORMAT = "neurofed-release/1";
const SIGNED_PREFIX = `${RELEASE_FORMAT}\n`;
const HEADER_KEYS = new Set(["format", "version", "parent", "created", "sha256", "size", "model_hash", "rollback_of"]);

/** Python's json.dumps(value, sort_keys=True, separators=(",", ":")) for the JSON values a header holds. */
function canonicalJson(value) {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (value !== null && typeof value === "object") {
    return `{${Object.keys(value).sort().map((k) => `${JSON.stringify(k)}:${canonicalJson(value[k])}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

function base64Bytes(b64, what) {
  let bin;
  try {
    bin = atob(b64);
  } catch {
    throw new NeurofedError(`${what} is not base64`);
  }
  return Uint8Array.from(bin, (c) => c.charCodeAt(0));
}

function hex(buffer) {
  return Array.from(new Uint8Array(buffer), (b) => b.toString(16).padStart(2, "0")).join("");
}

/** The Ed25519 public key of a PEM text (`neurofed release keygen` writes it: release.pub). */
export async function importReleaseKey(pem, subtle = globalThis.crypto?.subtle) {
  if (!subtle) throw new NeurofedError("this runtime has no WebCrypto (crypto.subtle): signed models cannot be checked");
  const m = /-----BEGIN PUBLIC KEY-----([\s\S]+?)-----END PUBLIC KEY-----/.exec(String(pem));
  if (!m) throw new NeurofedError("the release key is not a PEM public key (-----BEGIN PUBLIC KEY-----)");
  try {
    return await subtle.importKey("spki", base64Bytes(m[1].replace(/\s+/g, ""), "the release key"), { name: "Ed25519" },
      false, ["verify"]);
  } catch (err) {
    if (err instanceof NeurofedError) throw err;
    throw new NeurofedError(`the release key is not an Ed25519 public key (${err.name ?? err.message})`);
  }
}

/**
 * Verify a signed release before it is loaded: the signature document (text of MODEL.onnx.sig) must be signed by
 * `key` (from importReleaseKey) and name exactly these model bytes (size, sha256), and, when `meta` is given, the
 * model's hash. Returns the verified header; anything else throws a one-line NeurofedError.
 */
export async function verifyRelease(model, sigText, key, meta = null, subtle = globalThis.crypto?.subtle) {
  const bytes = model instanceof Uint8Array ? model : new Uint8Array(model);
  let doc;
  try {
    doc = JSON.parse(sigText);
  } catch {
    throw new NeurofedError("the model's signature file is not JSON");
  }
  const h = doc?.header;
  if (!doc || typeof doc !== "object" || Object.keys(doc).sort().join() !== "header,signature" ||
      !h || typeof h !== "object" || h.format !== RELEASE_FORMAT || !Object.keys(h).every((k) => HEADER_KEYS.has(k))) {
    throw new NeurofedError(`the model's signature file is not a ${RELEASE_FORMAT} document`);
  }
  if (!Number.isInteger(h.version) || h.version < 1 || typeof h.sha256 !== "string" || !Number.isInteger(h.size)) {
    throw new NeurofedError("the release header has an invalid version, sha256 or size");
  }
  const signed = new TextEncoder().encode(SIGNED_PREFIX + canonicalJson(h));
  const ok = await subtle.verify({ name: "Ed25519" }, key, base64Bytes(String(doc.signature), "the signature"), signed);
  if (!ok) throw new NeurofedError("bad signature: the model is not signed by the federation's release key (or its header was altered)");
  if (bytes.length !== h.size || hex(await subtle.digest("SHA-256", bytes)) !== h.sha256) {
    throw new NeurofedError("the model's bytes differ from the signed ones (sha256 mismatch: tampered or truncated)");
  }
  if (meta && h.model_hash && meta.model_hash && meta.model_hash !== h.model_hash) {
    throw new NeurofedError(`the metadata's model hash ${meta.model_hash.slice(0, 12)}… is not the release's ${h.model_hash.slice(0, 12)}…`);
  }
  return h;
}

// ----------------------------------------------------------------------------- following releases
// The JavaScript half of neurofed_runtime.follow (runtime/neurofed_runtime/follow.py): the coordinator publishes each
// signed release retained on neurofed/<federation>/release as one envelope,
//   b"NFR\x01" | uint32 big-endian length of the signature JSON | signature JSON | standalone ONNX bytes,
// a ReleaseFollower checks it (size cap, Ed25519 signature, strictly newer version, the graph's NeuroFed metadata
// against the signed model hash, the same channels, classes, rate, unit, window and preprocessing as the running
// model) and keeps an accepted one pending; the decode loop swaps to it between two windows with carryState (the
// session's alignment statistics and BN context carried). A refusal is one line and the decoder keeps its model.

export const RELEASE_MAGIC = Uint8Array.of(0x4e, 0x46, 0x52, 0x01);
export const MAX_RELEASE_BYTES = 32 << 20;
const MAX_SIG_BYTES = 16 << 10;
const MODEL_FREE = ["ea_count", "ea_cov_sum"];
const CONTEXT = ["n_context", "context"];

/** The retained release topic of a federation (the coordinator's). */
export function releaseTopic(federation) {
  return `neurofed/${federation}/release`;
}

/** `{model, sigText}` of a release envelope (nothing verified yet: pass them to verifyRelease). */
export function unpackRelease(payload, maxBytes = MAX_RELEASE_BYTES) {
  const b = payload instanceof Uint8Array ? payload : new Uint8Array(payload);
  if (b.length > maxBytes) throw new NeurofedError(`release payload of ${b.length} bytes exceeds the limit of ${maxBytes}`);
  const head = RELEASE_MAGIC.length + 4;
  if (b.length < head || RELEASE_MAGIC.some((v, i) => b[i] !== v)) {
    throw new NeurofedError("release payload is not a NeuroFed release envelope (bad magic)");
  }
  const n = new DataView(b.buffer, b.byteOffset, b.byteLength).getUint32(RELEASE_MAGIC.length, false);
  if (n > MAX_SIG_BYTES || head + n > b.length) {
    throw new NeurofedError(`release payload declares a ${n}-byte signature that does not fit`);
  }
  return { sigText: new TextDecoder().decode(b.subarray(head, head + n)), model: b.slice(head + n) };
}

function varint(b, pos) {
  let x = 0;
  for (let shift = 0; shift < 64; shift += 7) {
    if (pos >= b.length) throw new NeurofedError("not an ONNX model (truncated protobuf)");
    const byte = b[pos++];
    x += (byte & 0x7f) * 2 ** shift;
    if (byte < 0x80) return [x, pos];
  }
  throw new NeurofedError("not an ONNX model (a protobuf varint is too long)");
}

/** The string fields 1 (key) and 2 (value) of a protobuf StringStringEntryProto in b[pos, end). */
function entry(b, pos, end, dec) {
  const kv = {};
  while (pos < end) {
    let key, len;
    [key, pos] = varint(b, pos);
    if (key % 8 !== 2) throw new NeurofedError("not an ONNX model (a metadata entry is not a pair of strings)");
    [len, pos] = varint(b, pos);
    kv[key >> 3] = dec.decode(b.subarray(pos, pos + len));
    pos += len;
  }
  return kv;
}

/** An ONNX model's metadata_props (ModelProto field 14) as `{key: value}`; the graph itself is skipped, not read. */
export function onnxMetadata(bytes) {
  const b = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes);
  const dec = new TextDecoder();
  const out = {};
  let pos = 0;
  while (pos < b.length) {
    let key, len;
    [key, pos] = varint(b, pos);
    const field = Math.floor(key / 8), wire = key % 8;
    if (wire === 0) [, pos] = varint(b, pos);
    else if (wire === 1) pos += 8;
    else if (wire === 5) pos += 4;
    else if (wire === 2) {
      [len, pos] = varint(b, pos);
      if (pos + len > b.length) throw new NeurofedError("not an ONNX model (a protobuf field runs past its end)");
      if (field === 14) {
        const kv = entry(b, pos, pos + len, dec);
        out[kv[1]] = kv[2];
      }
      pos += len;
    } else throw new NeurofedError(`not an ONNX model (protobuf wire type ${wire})`);
  }
  return out;
}

/** The NeuroFed metadata (model card) inside an exported ONNX model: what model.json holds beside a bundle. */
export function modelMeta(bytes) {
  const props = onnxMetadata(bytes);
  if (!props.neurofed) throw new NeurofedError("the model carries no NeuroFed metadata (export it with `neurofed export --standalone`)");
  try {
    return JSON.parse(props.neurofed);
  } catch {
    throw new NeurofedError("the model's NeuroFed metadata is not JSON");
  }
}

function layoutOf(sa) {
  return Object.fromEntries(sa.state_layout.map((e) => [e.name, [e.offset, e.shape]]));
}

const size = (shape) => shape.reduce((a, b) => a * b, 1);

/** Why a model with metadata `meta` cannot replace the running decoder `dec` mid-session (null if it can). */
export function incompatibility(dec, meta) {
  const a = dec.meta, b = meta;
  const checks = [
    ["channels", a.ch_names, b.ch_names], ["classes", a.classes, b.classes],
    ["device rate", a.standalone.rate, b.standalone?.rate], ["unit", a.standalone.unit, b.standalone?.unit],
    ["window samples", a.standalone.window_samples, b.standalone?.window_samples],
    ["preprocessing", a.preprocess ?? {}, b.preprocess ?? {}],
  ];
  for (const [what, x, y] of checks) {
    if (canonicalJson(x) !== canonicalJson(y)) return `its ${what} (${canonicalJson(y)}) differ from the running model's (${canonicalJson(x)})`;
  }
  const la = layoutOf(a.standalone), lb = layoutOf(b.standalone);
  for (const name of [...MODEL_FREE, ...CONTEXT]) {
    if (la[name] && lb[name] && la[name][1].join() !== lb[name][1].join()) {
      return `its state entry ${name} has shape [${lb[name][1]}], the running model's [${la[name][1]}]`;
    }
  }
  return null;
}

/**
 * The new decoder's state continuing the session (neurofed_runtime.follow.carry_state): the alignment statistics
 * copied; the BN context copied when the new graph keeps nothing model-dependent per context window, else rebuilt by
 * running the `recent` accepted windows through the new graph (their covariances first taken out of the statistics),
 * so the new model continues as if it had decoded the session from its start. `{state, context}` (context: carried).
 */
export async function carryState(oldDec, newDec, state, recent = []) {
  const la = layoutOf(oldDec.sa), lb = layoutOf(newDec.sa);
  const out = newDec.initialState();
  const get = (name) => state.subarray(la[name][0], la[name][0] + size(la[name][1]));
  const put = (name, v) => out.set(v, lb[name][0]);
  for (const n of MODEL_FREE) if (la[n] && lb[n]) put(n, get(n));
  if (!CONTEXT.every((n) => la[n] && lb[n])) return { state: out, context: false };
  if (!Object.keys(lb).some((n) => n.startsWith("context_"))) {
    for (const n of CONTEXT) put(n, get(n));
    return { state: out, context: true };
  }
  const nCtx = Math.trunc(get("n_context")[0]);
  if (!recent.length || nCtx === 0 || recent.length < nCtx || !la.ea_count) return { state: out, context: false };
  if (lb.ea_cov_sum) {
    const [k, c, t] = la.context[1];
    const ctx = get("context");
    const cov = Float64Array.from(get("ea_cov_sum"));
    for (let w = k - nCtx; w < k; w++) {
      const x = ctx.subarray(w * c * t, (w + 1) * c * t);
      for (let i = 0; i < c; i++) {
        for (let j = 0; j < c; j++) {
          let s = 0;
          for (let n = 0; n < t; n++) s += x[i * t + n] * x[j * t + n];
          cov[i * c + j] -= s / t;
        }
      }
    }
    put("ea_cov_sum", cov);
  }
  put("ea_count", Float64Array.of(get("ea_count")[0] - nCtx));
  let s = out;
  for (const w of recent.slice(-nCtx)) ({ state: s } = await newDec.run(w, s));
  return { state: Float64Array.from(s), context: true };
}

/**
 * Verify releases arriving on the release topic (offer) and hand accepted ones to the decode loop (take). Offers are
 * checked one at a time, in arrival order. `refused` holds one line per refused release, `accepted` the versions
 * verified and loaded, `swaps` what the loop recorded (swapped).
 */
export class ReleaseFollower {
  constructor(ort, key, { version = null, current = null, executionProviders = ["cpu"], subtle = globalThis.crypto?.subtle,
    onRefused = null, onAccepted = null } = {}) {
    Object.assign(this, { ort, key, version, current, executionProviders, subtle, onRefused, onAccepted });
    this.newest = version;
    this.pending = null;
    this.refused = [];
    this.accepted = [];
    this.swaps = [];
    this.chain = Promise.resolve();
  }

  /** Check one payload (queued behind earlier ones); resolves to the accepted pending release or null. */
  offer(payload, source = "release") {
    const p = this.chain.then(() => this.check(payload, source));
    this.chain = p.catch(() => null);
    return p;
  }

  async check(payload, source) {
    const t0 = performance.now();
    try {
      const { model, sigText } = unpackRelease(payload);
      const meta = modelMeta(model);
      const h = await verifyRelease(model, sigText, this.key, meta, this.subtle);
      if (this.newest !== null && h.version <= this.newest) {
        throw new NeurofedError(`version ${h.version} is not newer than the running version ${this.newest}; kept the current model`);
      }
      if (!meta.standalone) throw new NeurofedError(`release ${h.version} is not a standalone graph`);
      const why = this.current ? incompatibility(this.current, meta) : null;
      if (why) throw new NeurofedError(`release ${h.version} cannot replace the running model: ${why}`);
      const dec = await StandaloneDecoder.create(this.ort, model, meta, this.executionProviders);
      this.pending = { version: h.version, dec, rollbackOf: h.rollback_of ?? null, tReceived: t0, tReady: performance.now() };
      this.newest = h.version;
      this.accepted.push(h.version);
      this.onAccepted?.(this.pending);
      return this.pending;
    } catch (err) {
      const line = `${source}: ${String(err.message).split("\n")[0]}`;
      this.refused.push(line);
      this.onRefused?.(line);
      return null;
    }
  }

  /** The accepted release not yet applied (and clear the slot). */
  take() {
    const p = this.pending;
    this.pending = null;
    return p;
  }

  /**
   * Swap the decode loop from `dec` (its session `state`, the `recent` accepted windows) to the pending release, if
   * any: `{dec, state, swap}` to continue with, or null when nothing is pending. Call it between two windows.
   */
  async swapIfPending(dec, state, recent = []) {
    const p = this.take();
    if (!p) return null;
    const { state: next, context } = await carryState(dec, p.dec, state, recent);
    const ea = layoutOf(p.dec.sa).ea_count;
    const swap = {
      version: p.version, previous: this.version, rollback_of: p.rollbackOf, context_carried: context,
      ea_windows_carried: ea ? Math.trunc(next[ea[0]]) : 0, verify_load_ms: p.tReady - p.tReceived,
      received_to_swap_ms: performance.now() - p.tReceived,
    };
    this.version = p.version;
    this.current = p.dec;
    this.swaps.push(swap);
    return { dec: p.dec, state: next, swap };
  }
}
