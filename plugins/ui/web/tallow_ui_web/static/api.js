// Requests to the server's OpenAI API: the API key in the Authorization header (never in a
// URL), a prompt for the key on 401, and the server-sent events of a streamed chat completion.

// the API lives beside /ui on the same origin (also under a path prefix)
const BASE = new URL("../", document.baseURI);

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body?.error?.message) message = body.error.message;
  } catch { /* not JSON: keep the status line */ }
  return new ApiError(response.status, message);
}

export class Api {
  /**
   * ``store`` keeps the key; ``askKey(retrying)`` shows the key prompt and resolves to the
   * key entered, or null when the user cancels.
   */
  constructor(store, askKey) {
    this.store = store;
    this.askKey = askKey;
  }

  async fetch(path, init = {}) {
    for (let retrying = false; ; retrying = true) {
      const headers = new Headers(init.headers || {});
      const key = this.store.apiKey;
      if (key) headers.set("Authorization", `Bearer ${key}`);
      const response = await fetch(new URL(path, BASE), {
        ...init, headers, credentials: "same-origin", cache: "no-store",
        referrerPolicy: "no-referrer", redirect: "error",
      });
      if (response.status !== 401) return response;
      const entered = await this.askKey(retrying || Boolean(key));
      if (!entered) throw await errorOf(response);
      this.store.apiKey = entered;
    }
  }

  async models() {
    const response = await this.fetch("v1/models");
    if (!response.ok) throw await errorOf(response);
    const body = await response.json();
    return (body.data || []).map((m) => String(m.id));
  }

  /**
   * Streams a chat completion: ``onChunk(choiceDelta, choice, chunk)`` for each event of the
   * first choice. Resolves when the stream ends; rejects with an AbortError on ``signal``.
   */
  async chat(body, signal, onChunk) {
    const response = await this.fetch("v1/chat/completions", {
      method: "POST", signal, body: JSON.stringify({ ...body, stream: true }),
      headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
    });
    if (!response.ok) throw await errorOf(response);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let cut;
      while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
        const data = event.split(/\r?\n/).filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).trimStart()).join("\n");
        if (!data) continue;
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new ApiError(chunk.error.code || 500, chunk.error.message || "error");
        const choice = (chunk.choices || [])[0];
        if (choice) onChunk(choice.delta || {}, choice, chunk);
      }
    }
  }
}
