// Runs on the audio thread: downmix, low-pass, resample to 16 kHz, convert to PCM16, and post
// 100 ms pieces to the page. Resampling is linear interpolation after a two-pole low-pass at
// 7 kHz, which keeps most aliasing out of the 0-8 kHz band the recogniser hears.
const TARGET_RATE = 16000;
const PIECE = 1600; // samples per message: 100 ms

class Pcm16kProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / TARGET_RATE; // input samples per output sample
    this.position = 0; // fractional read position, relative to the current block
    this.previous = 0; // last filtered sample of the previous block
    const w = Math.tan(Math.PI * Math.min(7000, 0.45 * sampleRate) / sampleRate);
    const k = 1 / (1 + Math.SQRT2 * w + w * w); // Butterworth biquad coefficients
    this.b0 = w * w * k; this.b1 = 2 * this.b0; this.b2 = this.b0;
    this.a1 = 2 * (w * w - 1) * k; this.a2 = (1 - Math.SQRT2 * w + w * w) * k;
    this.x1 = this.x2 = this.y1 = this.y2 = 0;
    this.out = new Int16Array(PIECE);
    this.filled = 0;
    this.port.onmessage = (event) => { if (event.data === "flush") this.flush(); };
  }

  flush() {
    if (this.filled > 0) this.port.postMessage(this.out.slice(0, this.filled).buffer);
    this.filled = 0;
    this.port.postMessage("flushed");
  }

  lowpass(x) {
    const y = this.b0 * x + this.b1 * this.x1 + this.b2 * this.x2 - this.a1 * this.y1 - this.a2 * this.y2;
    this.x2 = this.x1; this.x1 = x; this.y2 = this.y1; this.y1 = y;
    return y;
  }

  process(inputs) {
    const channels = inputs[0];
    if (!channels || channels.length === 0) return true;
    const n = channels[0].length;
    const mono = new Float32Array(n);
    for (const channel of channels) for (let i = 0; i < n; i++) mono[i] += channel[i] / channels.length;
    for (let i = 0; i < n; i++) mono[i] = this.lowpass(mono[i]);
    // Output sample at input position p (p may fall between the previous block's last sample,
    // index -1, and this block's first).
    while (this.position < n - 1) {
      const i = Math.floor(this.position);
      const frac = this.position - i;
      const left = i < 0 ? this.previous : mono[i];
      const value = left + (mono[i + 1] - left) * frac;
      this.out[this.filled++] = Math.max(-32768, Math.min(32767, Math.round(value * 32767)));
      if (this.filled === PIECE) { this.port.postMessage(this.out.slice().buffer); this.filled = 0; }
      this.position += this.step;
    }
    this.position -= n;
    this.previous = mono[n - 1];
    return true;
  }
}

registerProcessor("pcm-16k", Pcm16kProcessor);
