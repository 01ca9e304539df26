// The page: microphone -> AudioWorklet (16 kHz PCM16) -> /ws/transcribe; on stop, the final
// transcript goes to /api/generate and the answer streams in as server-sent events. Hands-free,
// each segment (speech the server has seen end in a pause) is answered as it comes, and the
// microphone stays open until Stop.
const token = new URLSearchParams(location.search).get("token");
const withToken = (path) => (token ? `${path}${path.includes("?") ? "&" : "?"}token=${encodeURIComponent(token)}` : path);

const $ = (id) => document.getElementById(id);
const startButton = $("start"), stopButton = $("stop");
let session = null; // {context, stream, node, socket}
let answering = Promise.resolve(); // hands-free answers, one after another

function status(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

async function start() {
  startButton.disabled = true;
  $("transcript").textContent = ""; $("question").textContent = ""; $("answer").textContent = ""; $("speed").textContent = "";
  try {
    const stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1 } });
    const context = new AudioContext();
    await context.audioWorklet.addModule(withToken("static/pcm-worklet.js"));
    const source = context.createMediaStreamSource(stream);
    const node = new AudioWorkletNode(context, "pcm-16k");
    const wsUrl = new URL(withToken("ws/transcribe"), location.href);
    wsUrl.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    const socket = new WebSocket(wsUrl);
    socket.binaryType = "arraybuffer";
    await new Promise((resolve, reject) => { socket.onopen = resolve; socket.onerror = () => reject(new Error("could not connect to the server")); });
    socket.onmessage = (event) => onTranscript(JSON.parse(event.data));
    socket.onclose = (event) => { if (session && session.socket === socket && event.code !== 1000) status(`connection closed (${event.code} ${event.reason})`, true); };
    node.port.onmessage = (event) => {
      if (event.data === "flushed") socket.send(JSON.stringify({ type: "end" }));
      else if (socket.readyState === WebSocket.OPEN) socket.send(event.data);
    };
    source.connect(node);
    session = { context, stream, node, socket };
    stopButton.disabled = false;
    status($("handsfree").checked ? "Listening… ask, then pause: each question is answered. Stop ends." : "Listening… speak, then press Stop.");
  } catch (error) {
    status(`error: ${error.message}`, true);
    startButton.disabled = false;
  }
}

function stop() {
  if (!session) return;
  stopButton.disabled = true;
  session.stream.getTracks().forEach((track) => track.stop());
  session.node.port.postMessage("flush"); // the worklet posts its last samples, then "flushed"
  status("Finishing the transcript…");
}

function onTranscript(message) {
  const box = $("transcript");
  const handsFree = $("handsfree").checked;
  if (message.type === "partial") { box.textContent = message.text; box.className = "partial"; }
  else if (message.type === "segment") { if (handsFree) answering = answering.then(() => answer(message.text)); }
  else if (message.type === "final") {
    box.textContent = message.text; box.className = "";
    const { context, socket } = session; session = null;
    socket.close(1000); context.close();
    startButton.disabled = false;
    status(`Heard ${message.duration.toFixed(1)} s of speech, recognised at ${message.rtf.toFixed(3)}x real time.`);
    if (!message.text.trim()) status("No speech recognised: try again.", true);
    else if (!handsFree) answer(message.text); // hands-free, its segments were answered already
  } else if (message.type === "error") status(`error: ${message.message}`, true);
}

async function answer(prompt) {
  $("question").textContent = prompt; $("answer").textContent = ""; $("speed").textContent = "";
  const method = $("method").value;
  const headers = { "Content-Type": "application/json" };
  if (token) headers.Authorization = `Bearer ${token}`;
  const response = await fetch("api/generate", { method: "POST", headers, body: JSON.stringify({ prompt, method }) });
  if (!response.ok) { status(`error: ${(await response.json()).detail}`, true); return; }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end); buffer = buffer.slice(end + 2);
      const event = /^event: (.*)$/m.exec(block)[1];
      const data = JSON.parse(/^data: (.*)$/m.exec(block)[1]);
      if (event === "token") $("answer").textContent += data.text;
      else if (event === "done") $("speed").textContent = `${data.new_tokens} tokens, ${data.tokens_per_second.toFixed(1)} tokens/s, ${data.mean_accepted.toFixed(2)} tokens per forward pass (${data.method})`;
      else if (event === "error") status(`error: ${data.message}`, true);
    }
  }
}

async function offerMethods() {
  // Only the methods this server's model can run (ss needs stream weights).
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const response = await fetch("health", { headers });
  if (!response.ok) { status(`error: the server said ${response.status}`, true); return; }
  const { methods } = await response.json();
  for (const option of [...$("method").options]) if (!methods.includes(option.value)) option.remove();
}

offerMethods();
startButton.addEventListener("click", start);
stopButton.addEventListener("click", stop);
