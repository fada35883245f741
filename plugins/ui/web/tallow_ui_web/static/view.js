// The DOM of one message: user text as plain text, the assistant's answer as Markdown (grown
// incrementally while it streams), its reasoning folded, its tool calls and their results.

import { renderMarkdown, StreamingMarkdown } from "./markdown.js";

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

function button(label, className, onClick, aria) {
  const b = el("button", className, label);
  b.type = "button";
  if (aria) b.setAttribute("aria-label", aria);
  b.addEventListener("click", onClick);
  return b;
}

/** Merges streamed tool-call parts into ``list`` by their index. */
export function mergeCalls(list, parts) {
  for (const part of parts || []) {
    const index = part.index ?? list.length;
    const call = list.find((c) => c.index === index);
    if (!call) {
      list.push({ index, id: part.id || "", name: part.function?.name || "",
                  arguments: part.function?.arguments || "", provider: part.provider || "",
                  result: part.result || null });
      continue;
    }
    if (part.id) call.id = part.id;
    if (part.function?.name) call.name += part.function.name;
    if (part.function?.arguments) call.arguments += part.function.arguments;
    if (part.result) call.result = part.result;
  }
  return list;
}

function toolCallView(call, ranByServer) {
  const box = el("div", "tool-call");
  const head = el("div", "tool-head");
  head.append(el("span", "tool-kind", ranByServer ? "Tool (server)" : "Tool call"), " ",
              el("code", "tool-name", call.name || "…"));
  box.append(head);
  if (call.arguments) box.append(el("pre", "tool-args", call.arguments));
  if (call.result) {
    const result = el("details", "tool-result" + (call.result.is_error ? " error" : ""));
    result.append(el("summary", "", call.result.is_error ? "Error result" : "Result"),
                  el("pre", "", String(call.result.content ?? "")));
    box.append(result);
  }
  return box;
}

/** One message's element and the methods that update it while it streams. */
export class MessageView {
  constructor(message, index, actions) {
    this.message = message;
    this.index = index;
    this.actions = actions;
    this.root = el("article", `message ${message.role}`);
    this.root.dataset.index = String(index);
    this.root.setAttribute("aria-label", message.role === "user" ? "You" : "Assistant");
    this.build();
  }

  build() {
    const m = this.message;
    this.root.replaceChildren();
    if (m.role === "user") {
      if (m.images?.length) {
        const images = el("div", "message-images");
        m.images.forEach((url, i) => {
          const thumb = el("img", "thumb");
          thumb.src = url;  // the data: URL of an image the user attached
          thumb.alt = `Image ${i + 1}`;
          images.append(thumb);
        });
        this.root.append(images);
      }
      this.body = el("div", "bubble", m.content);
      this.body.hidden = !m.content;
      const tools = el("div", "message-actions");
      tools.append(button("Edit", "edit", () => this.edit(), "Edit this message and resend"));
      this.root.append(this.body, tools);
      return;
    }
    this.reasoning = el("details", "reasoning");
    this.reasoning.append(el("summary", "", "Reasoning"));
    this.reasoningText = el("div", "reasoning-text", m.reasoning || "");
    this.reasoning.append(this.reasoningText);
    this.reasoning.hidden = !m.reasoning;
    this.tools = el("div", "tool-calls");
    this.content = el("div", "content markdown");
    this.notice = el("p", "notice");
    this.actionsBar = el("div", "message-actions");
    this.root.append(this.reasoning, this.tools, this.content, this.notice, this.actionsBar);
    this.markdown = renderMarkdown(this.content, m.content || "");
    this.renderTools();
    this.renderNotice();
  }

  renderTools() {
    const m = this.message;
    this.tools.replaceChildren(...(m.server_tool_calls || []).map((c) => toolCallView(c, true)),
                               ...(m.tool_calls || []).map((c) => toolCallView(c, false)));
  }

  renderNotice() {
    const m = this.message;
    const text = m.error ? `Error: ${m.error}` : m.stopped ? "Stopped." :
      m.finish_reason === "length" ? "Stopped at the token limit." : "";
    this.notice.textContent = text;
    this.notice.hidden = !text;
    this.notice.classList.toggle("error", Boolean(m.error));
  }

  /** Shows Regenerate on the last answer only. */
  setLast(isLast, busy) {
    if (this.message.role !== "assistant") return;
    this.actionsBar.replaceChildren();
    if (isLast && !busy) {
      this.actionsBar.append(button("Regenerate", "regenerate", () => this.actions.regenerate()));
    }
  }

  setBusy(busy) {
    this.root.querySelectorAll("button.edit").forEach((b) => { b.disabled = busy; });
  }

  // -- streaming --------------------------------------------------------------------------
  begin() {
    this.root.classList.add("streaming");
    this.markdown = new StreamingMarkdown(this.content);
    this.content.replaceChildren();
  }

  appendContent(text) {
    this.message.content += text;
    this.markdown.append(text);
  }

  appendReasoning(text) {
    this.message.reasoning = (this.message.reasoning || "") + text;
    this.reasoningText.append(text);  // a text node
    this.reasoning.hidden = false;
  }

  finish() {
    this.root.classList.remove("streaming");
    this.markdown.render();
    this.renderTools();
    this.renderNotice();
  }

  // -- editing a user message -------------------------------------------------------------
  edit() {
    const area = el("textarea", "edit-area");
    area.value = this.message.content;
    area.rows = Math.min(12, Math.max(2, this.message.content.split("\n").length));
    area.setAttribute("aria-label", "Edit the message");
    const save = button("Save and send", "primary save", () => {
      const text = area.value.trim();
      if (text) this.actions.resend(this.index, text);
    });
    const cancel = button("Cancel", "cancel", () => this.build());
    area.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        save.click();
      } else if (event.key === "Escape") {
        event.preventDefault();
        this.build();
      }
    });
    const bar = el("div", "message-actions");
    bar.append(cancel, save);
    this.root.replaceChildren(area, bar);
    area.focus();
  }
}
