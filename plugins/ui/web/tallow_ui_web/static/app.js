// The chat page: conversation list, composer, streaming, settings and the API-key prompt.

import { Api } from "./api.js";
import { Store } from "./store.js";
import { mergeCalls, MessageView } from "./view.js";

const $ = (id) => document.getElementById(id);

const store = new Store();
const api = new Api(store, askKey);
let views = [];
let controller = null;  // the AbortController of the request streaming now
let attachments = [];  // images to send with the next message: { name, url } (data: URLs)

// the image types the server decodes
const IMAGE_TYPES = ["image/png", "image/jpeg", "image/webp"];

// ---- the API key --------------------------------------------------------------------------
function askKey(retrying) {
  const dialog = $("api-key-dialog");
  const input = $("api-key");
  input.value = "";
  $("api-key-title").textContent = retrying ? "That API key was refused" : "API key";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      resolve(dialog.returnValue === "save" && input.value.trim() ? input.value.trim() : null);
    }, { once: true });
    dialog.returnValue = "";
    dialog.showModal();
    input.focus();
  });
}

// ---- status line --------------------------------------------------------------------------
function status(text) {
  $("status").textContent = text;
}

// ---- conversation list --------------------------------------------------------------------
function renderList() {
  const list = $("conversations");
  const template = $("conversation-item");
  list.replaceChildren();
  for (const conv of store.sorted()) {
    const item = template.content.firstElementChild.cloneNode(true);
    item.dataset.id = conv.id;
    const open = item.querySelector(".open");
    open.textContent = conv.title;
    open.title = conv.title;
    if (conv.id === store.currentId) {
      item.classList.add("active");
      open.setAttribute("aria-current", "true");
    }
    open.addEventListener("click", () => {
      if (controller) return;
      store.select(conv.id);
      renderAll();
      closeSidebar();
    });
    item.querySelector(".rename").addEventListener("click", () => startRename(item, conv));
    item.querySelector(".delete").addEventListener("click", () => {
      if (controller && conv.id === store.currentId) return;
      if (!confirm(`Delete "${conv.title}"?`)) return;
      store.remove(conv.id);
      renderAll();
    });
    list.append(item);
  }
}

function startRename(item, conv) {
  const input = document.createElement("input");
  input.className = "rename-input";
  input.value = conv.title;
  input.setAttribute("aria-label", "New name");
  const open = item.querySelector(".open");
  open.replaceWith(input);
  input.focus();
  input.select();
  let done = false;
  const finish = (save) => {
    if (done) return;
    done = true;
    if (save) store.rename(conv.id, input.value);
    renderList();
  };
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") { event.preventDefault(); finish(true); }
    else if (event.key === "Escape") { event.preventDefault(); finish(false); }
  });
  input.addEventListener("blur", () => finish(true));
}

// ---- messages -----------------------------------------------------------------------------
const actions = {
  regenerate: () => regenerate(),
  resend: (index, text) => resend(index, text),
};

function renderMessages() {
  const box = $("messages");
  const conv = store.current();
  views = (conv ? conv.messages : []).map((m, i) => new MessageView(m, i, actions));
  box.replaceChildren(...views.map((v) => v.root));
  if (!views.length) {
    const empty = document.createElement("p");
    empty.className = "empty";
    empty.textContent = "Ask anything. Conversations stay in this browser.";
    box.append(empty);
  }
  refreshActions();
  box.scrollTop = box.scrollHeight;
}

function refreshActions() {
  const busy = Boolean(controller);
  views.forEach((v, i) => {
    v.setLast(i === views.length - 1, busy);
    v.setBusy(busy);
  });
}

function renderAll() {
  renderList();
  renderMessages();
}

function nearBottom(box) {
  return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
}

// ---- requests -----------------------------------------------------------------------------
function number(text, field) {
  if (text === "" || text === null || text === undefined) return undefined;
  const value = Number(text);
  if (!Number.isFinite(value)) throw new Error(`${field}: not a number`);
  return value;
}

function requestBody(messages) {
  const s = store.settings;
  const body = { messages: [] };
  if (s.model) body.model = s.model;
  if (s.system.trim()) body.messages.push({ role: "system", content: s.system });
  for (const m of messages) {
    if (m.role === "user" && m.images?.length) {
      // OpenAI's content parts: the text, then each image as a data: URL
      const parts = m.content ? [{ type: "text", text: m.content }] : [];
      for (const url of m.images) parts.push({ type: "image_url", image_url: { url } });
      body.messages.push({ role: "user", content: parts });
    } else if (m.role === "user" || (m.role === "assistant" && m.content)) {
      body.messages.push({ role: m.role, content: m.content });
    }
  }
  const temperature = number(s.temperature, "Temperature");
  const topP = number(s.topP, "Top-p");
  const maxTokens = number(s.maxTokens, "Max tokens");
  if (temperature !== undefined) body.temperature = temperature;
  if (topP !== undefined) body.top_p = topP;
  if (maxTokens !== undefined) body.max_tokens = Math.round(maxTokens);
  if (s.structured) {
    let schema;
    try {
      schema = JSON.parse(s.schema || "{}");
    } catch (e) {
      throw new Error(`JSON schema: ${e.message}`);
    }
    body.response_format = { type: "json_schema",
                             json_schema: { name: "output", schema, strict: true } };
  }
  if (s.serverTools) body.server_tools = "always";
  return body;
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  document.body.classList.toggle("busy", busy);
  // screen readers announce the answer once it is complete, not token by token
  $("messages").setAttribute("aria-busy", String(busy));
  refreshActions();
}

async function generate(conv) {
  const message = { role: "assistant", content: "", reasoning: "", tool_calls: [],
                    server_tool_calls: [] };
  const history = conv.messages.slice();
  conv.messages.push(message);
  const view = new MessageView(message, conv.messages.length - 1, actions);
  $("messages").querySelector(".empty")?.remove();
  $("messages").append(view.root);
  views.push(view);
  view.begin();
  controller = new AbortController();
  setBusy(true);
  status("Generating…");
  store.touch(conv);
  const box = $("messages");
  let lastSave = Date.now();
  try {
    const body = requestBody(history);
    await api.chat(body, controller.signal, (delta, choice) => {
      const follow = nearBottom(box);
      if (delta.reasoning_content) view.appendReasoning(delta.reasoning_content);
      if (delta.content) view.appendContent(delta.content);
      if (delta.tool_calls) { mergeCalls(message.tool_calls, delta.tool_calls); view.renderTools(); }
      if (delta.server_tool_calls) {
        mergeCalls(message.server_tool_calls, delta.server_tool_calls);
        view.renderTools();
      }
      if (choice.finish_reason) message.finish_reason = choice.finish_reason;
      if (follow) box.scrollTop = box.scrollHeight;
      if (Date.now() - lastSave > 500) {  // a reload mid-answer keeps what came so far
        store.save();
        lastSave = Date.now();
      }
    });
    status("");
  } catch (error) {
    if (error.name === "AbortError") {
      message.stopped = true;
      status("Stopped");
    } else {
      message.error = error.message || String(error);
      status("");
    }
  } finally {
    controller = null;
    view.finish();
    if (!store.touch(conv)) status("Could not save the conversation (storage full?)");
    setBusy(false);
    $("prompt").focus();
  }
}

async function send(text, images = []) {
  if (controller) return;
  let conv = store.current();
  if (!conv) conv = store.create();
  const message = { role: "user", content: text };
  if (images.length) message.images = images;
  conv.messages.push(message);
  const view = new MessageView(conv.messages.at(-1), conv.messages.length - 1, actions);
  $("messages").querySelector(".empty")?.remove();
  $("messages").append(view.root);
  views.push(view);
  store.touch(conv);
  renderList();
  await generate(conv);
  renderList();
}

async function regenerate() {
  const conv = store.current();
  if (!conv || controller) return;
  while (conv.messages.length && conv.messages.at(-1).role === "assistant") conv.messages.pop();
  renderMessages();
  await generate(conv);
}

async function resend(index, text) {
  const conv = store.current();
  if (!conv || controller) return;
  const images = conv.messages[index]?.images;  // an edited message keeps its images
  conv.messages = conv.messages.slice(0, index);
  conv.messages.push(images?.length ? { role: "user", content: text, images }
                                    : { role: "user", content: text });
  renderMessages();
  await generate(conv);
}

// ---- attached images ----------------------------------------------------------------------
function renderAttachments() {
  const box = $("attachments");
  box.replaceChildren(...attachments.map((image, i) => {
    const item = document.createElement("div");
    item.className = "attachment";
    const thumb = document.createElement("img");
    thumb.className = "thumb";
    thumb.src = image.url;  // a data: URL read from the user's own file
    thumb.alt = image.name;
    thumb.title = image.name;
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "icon remove";
    remove.textContent = "✕";
    remove.setAttribute("aria-label", `Remove ${image.name}`);
    remove.addEventListener("click", () => {
      attachments.splice(i, 1);
      renderAttachments();
      $("prompt").focus();
    });
    item.append(thumb, remove);
    return item;
  }));
  box.hidden = !attachments.length;
}

function readAsDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result));
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function attachFiles(files) {
  for (const file of files) {
    if (!IMAGE_TYPES.includes(file.type)) {
      status(`${file.name}: not a PNG, JPEG or WebP image`);
      continue;
    }
    try {
      attachments.push({ name: file.name, url: await readAsDataUrl(file) });
      status("");
    } catch (error) {
      status(`${file.name}: ${error?.message || "cannot be read"}`);
    }
  }
  renderAttachments();
}

// ---- models and settings ------------------------------------------------------------------
async function loadModels() {
  const select = $("model");
  try {
    const models = await api.models();
    select.replaceChildren(...models.map((id) => new Option(id, id)));
    if (!models.includes(store.settings.model)) store.settings.model = models[0] || "";
    select.value = store.settings.model;
    status("");
  } catch (error) {
    status(`Models: ${error.message}`);
  }
}

const FIELDS = [
  ["set-system", "system"], ["set-temperature", "temperature"], ["set-top-p", "topP"],
  ["set-max-tokens", "maxTokens"], ["set-schema", "schema"],
];

function openSettings() {
  const s = store.settings;
  for (const [id, key] of FIELDS) $(id).value = s[key];
  $("set-structured").checked = s.structured;
  $("set-server-tools").checked = s.serverTools;
  $("schema-error").hidden = true;
  $("settings").showModal();
}

function saveSettings(event) {
  const s = store.settings;
  const structured = $("set-structured").checked;
  const schema = $("set-schema").value;
  if (structured) {
    try {
      const parsed = JSON.parse(schema || "null");
      if (typeof parsed !== "object" || parsed === null) throw new Error("expected a JSON object");
    } catch (e) {
      event.preventDefault();
      $("schema-error").textContent = `JSON schema: ${e.message}`;
      $("schema-error").hidden = false;
      return;
    }
  }
  for (const [id, key] of FIELDS) s[key] = $(id).value;
  s.structured = structured;
  s.serverTools = $("set-server-tools").checked;
  store.saveSettings();
}

// ---- phone layout -------------------------------------------------------------------------
function openSidebar() {
  document.body.classList.add("sidebar-open");
  $("open-sidebar").setAttribute("aria-expanded", "true");
  $("new-chat").focus();
}

function closeSidebar() {
  document.body.classList.remove("sidebar-open");
  $("open-sidebar").setAttribute("aria-expanded", "false");
}

// ---- wiring -------------------------------------------------------------------------------
function wire() {
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const prompt = $("prompt");
    const text = prompt.value.trim();
    if ((!text && !attachments.length) || controller) return;
    const images = attachments.map((image) => image.url);
    prompt.value = "";
    attachments = [];
    renderAttachments();
    send(text, images);
  });
  $("attach").addEventListener("click", () => $("attach-input").click());
  $("attach-input").addEventListener("change", async () => {
    const input = $("attach-input");
    const files = [...input.files];
    input.value = "";  // choosing the same file again fires change again
    await attachFiles(files);
    $("prompt").focus();
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => controller?.abort());
  $("new-chat").addEventListener("click", () => {
    if (controller) return;
    store.create();
    renderAll();
    closeSidebar();
    $("prompt").focus();
  });
  $("model").addEventListener("change", () => {
    store.settings.model = $("model").value;
    store.saveSettings();
  });
  $("open-settings").addEventListener("click", openSettings);
  $("settings-form").addEventListener("submit", saveSettings);
  $("api-key").addEventListener("keydown", (event) => {
    // Enter saves (implicit submission would press the form's first button, Cancel)
    if (event.key === "Enter" && !event.isComposing) {
      event.preventDefault();
      if ($("api-key").value.trim()) $("api-key-dialog").close("save");
    }
  });
  $("forget-key").addEventListener("click", () => {
    store.apiKey = "";
    status("API key forgotten");
  });
  $("open-sidebar").addEventListener("click", openSidebar);
  $("close-sidebar").addEventListener("click", closeSidebar);
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape" || document.querySelector("dialog[open]")) return;
    if (document.body.classList.contains("sidebar-open")) closeSidebar();
    else if (controller) controller.abort();  // Escape stops the answer being written
  });
  // copy buttons of code blocks, including those of an answer still streaming
  $("messages").addEventListener("click", async (event) => {
    const copy = event.target.closest("button.copy");
    if (!copy) return;
    const code = copy.closest(".code-block")?.querySelector("pre code");
    try {
      await navigator.clipboard.writeText(code ? code.textContent : "");
      copy.textContent = "Copied";
    } catch {
      copy.textContent = "Copy failed";
    }
    setTimeout(() => { copy.textContent = "Copy"; }, 1500);
  });
  window.addEventListener("storage", (event) => {  // another tab changed the conversations
    if (event.key?.startsWith("tallow-ui:") && !controller) {
      Object.assign(store, new Store());
      renderAll();
    }
  });
}

wire();
renderAll();
loadModels();
$("prompt").focus();
