// Markdown to DOM, safe by construction: every element is made with createElement and every
// piece of text lands in a text node, so nothing a model writes is ever parsed as HTML (raw
// HTML in the source shows as text). Links keep only http, https and mailto URLs; images are
// shown as links, never loaded.
//
// StreamingMarkdown renders a growing text incrementally: the source is cut into chunks at
// blank lines outside code fences; a chunk followed by a blank line is complete and rendered
// once, only the last (open) chunk is rebuilt as tokens arrive.

import { highlight } from "./highlight.js";

const SAFE_PROTOCOLS = new Set(["http:", "https:", "mailto:"]);

/** ``raw`` as an absolute http(s)/mailto URL, or null for anything else. */
export function safeUrl(raw) {
  let url;
  try {
    url = new URL(raw.trim());
  } catch {
    return null;
  }
  return SAFE_PROTOCOLS.has(url.protocol) ? url.href : null;
}

function el(tag, className) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  return e;
}

// ---- inline ------------------------------------------------------------------------------
const ESCAPABLE = "\\`*_{}[]()#+-.!~<>|";
const BARE_URL = /^https?:\/\/[^\s<>"]*[^\s<>"().,;:!?'*_~\]]/;
const AUTOLINK = /^<((?:https?|mailto):[^\s<>]+)>/i;

// the index of the "]" closing the "[" at ``start``, or -1
function closingBracket(text, start) {
  let depth = 0;
  for (let i = start; i < text.length; i++) {
    if (text[i] === "\\") { i++; continue; }
    if (text[i] === "[") depth++;
    else if (text[i] === "]" && --depth === 0) return i;
  }
  return -1;
}

// the destination of a link whose "(" is at ``open``: [url, index after ")"] or null
function destination(text, open) {
  let depth = 0;
  for (let i = open; i < text.length; i++) {
    const c = text[i];
    if (c === "\\") { i++; continue; }
    if (c === "(") depth++;
    else if (c === ")" && --depth === 0) {
      let inner = text.slice(open + 1, i).trim();
      const titled = inner.match(/^(\S+)\s+["'(].*["')]$/s);
      if (titled) inner = titled[1];
      if (inner.startsWith("<") && inner.endsWith(">")) inner = inner.slice(1, -1);
      return [inner, i + 1];
    } else if (c === "\n" && depth === 1 && text[i + 1] === "\n") return null;
  }
  return null;
}

function link(href, children) {
  const a = el("a");
  a.href = href;
  a.target = "_blank";
  a.rel = "noopener noreferrer nofollow";
  a.append(...children);
  return a;
}

// the closing delimiter of single-character emphasis opened at ``i``, or -1
function closingEmphasis(text, i, c) {
  for (let j = i + 2; j < text.length; j++) {
    if (text[j] === "\\") { j++; continue; }
    if (text[j] === "`") {  // code spans inside emphasis are opaque
      const end = text.indexOf("`", j + 1);
      if (end < 0) return -1;
      j = end;
      continue;
    }
    if (text[j] === c && text[j - 1] !== " " && text[j + 1] !== c && text[j - 1] !== c
        && !(c === "_" && /\w/.test(text[j + 1] || ""))) return j;
  }
  return -1;
}

// the closing ``pair`` (**, __ or ~~) of a span opened before ``from``, or -1; an underscore
// pair inside a word (snake__case) neither opens nor closes
function closingPair(text, from, pair) {
  for (let j = text.indexOf(pair, from); j >= 0; j = text.indexOf(pair, j + 1)) {
    if (text[j - 1] === " ") continue;
    if (pair === "__" && /\w/.test(text[j + 2] || "")) continue;
    return j;
  }
  return -1;
}

/** Appends the inline Markdown of ``text`` to ``out`` (an element or fragment). */
export function renderInline(text, out) {
  let buf = "";
  const flush = () => {
    if (buf) out.append(buf);  // a text node
    buf = "";
  };
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    const rest = text.slice(i);
    if (c === "\\" && ESCAPABLE.includes(text[i + 1] || "\0")) {
      buf += text[i + 1];
      i += 2;
      continue;
    }
    if (c === "\n") {
      flush();
      out.append(el("br"));
      i++;
      continue;
    }
    if (c === "`") {
      let n = 1;
      while (text[i + n] === "`") n++;
      const end = text.indexOf("`".repeat(n), i + n);
      if (end > 0) {
        flush();
        const code = el("code");
        let body = text.slice(i + n, end).replace(/\n/g, " ");
        if (body.length > 2 && body.startsWith(" ") && body.endsWith(" ")) body = body.slice(1, -1);
        code.textContent = body;
        out.append(code);
        i = end + n;
      } else {
        buf += "`".repeat(n);
        i += n;
      }
      continue;
    }
    const pair = text.slice(i, i + 2);
    if ((pair === "**" || pair === "__" || pair === "~~") && text[i + 2] && text[i + 2] !== " "
        && !(pair === "__" && /\w/.test(text[i - 1] || ""))) {
      const end = closingPair(text, i + 2, pair);
      if (end > i + 2) {
        flush();
        const e = el(pair === "~~" ? "del" : "strong");
        renderInline(text.slice(i + 2, end), e);
        out.append(e);
        i = end + 2;
        continue;
      }
    }
    if ((c === "*" || c === "_") && text[i + 1] && text[i + 1] !== " " && text[i + 1] !== c
        && !(c === "_" && /\w/.test(text[i - 1] || ""))) {
      const end = closingEmphasis(text, i, c);
      if (end > 0) {
        flush();
        const e = el("em");
        renderInline(text.slice(i + 1, end), e);
        out.append(e);
        i = end + 1;
        continue;
      }
    }
    const image = c === "!" && text[i + 1] === "[";
    if (c === "[" || image) {
      const open = image ? i + 1 : i;
      const close = closingBracket(text, open);
      if (close > 0 && text[close + 1] === "(") {
        const dest = destination(text, close + 1);
        if (dest) {
          flush();
          const label = document.createDocumentFragment();
          renderInline(text.slice(open + 1, close), label);
          if (image) label.prepend("🖼 ");
          const href = safeUrl(dest[0]);
          if (href) out.append(link(href, [label]));
          else {  // an unsafe or relative destination: the text, not a link
            const s = el("span", "unsafe-link");
            s.append(label);
            out.append(s);
          }
          i = dest[1];
          continue;
        }
      }
    }
    // <https://…> and bare http(s) URLs
    const auto = c === "<" ? rest.match(AUTOLINK)
      : c === "h" && !/\w/.test(text[i - 1] || "") ? rest.match(BARE_URL) : null;
    const shown = auto && (auto[1] ?? auto[0]);
    const href = shown && safeUrl(shown);
    if (href) {
      flush();
      out.append(link(href, [shown]));
      i += auto[0].length;
      continue;
    }
    buf += c;
    i++;
  }
  flush();
}

// ---- blocks ------------------------------------------------------------------------------
const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})(?:\s+(.*?))?\s*#*\s*$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const ITEM = /^( {0,3})([-*+]|\d{1,9}[.)])(\s+|$)(.*)$/;
const TABLE_RULE = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

function isBlockStart(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line)
    || ITEM.test(line);
}

function codeBlock(code, lang) {
  const box = el("div", "code-block");
  const head = el("div", "code-head");
  const name = el("span", "code-lang");
  name.textContent = lang || "text";
  const copy = el("button", "copy");
  copy.type = "button";
  copy.textContent = "Copy";
  copy.setAttribute("aria-label", "Copy the code");
  head.append(name, copy);
  const pre = el("pre");
  const codeEl = el("code", "hl");
  codeEl.dataset.lang = lang || "";
  codeEl.append(highlight(code, lang));
  pre.append(codeEl);
  box.append(head, pre);
  return box;
}

function cells(line) {
  let s = line.trim();
  if (s.startsWith("|")) s = s.slice(1);
  if (s.endsWith("|") && !s.endsWith("\\|")) s = s.slice(0, -1);
  return s.split(/(?<!\\)\|/).map((c) => c.trim());
}

function table(lines) {
  const t = el("table");
  const align = cells(lines[1]).map((c) =>
    c.startsWith(":") && c.endsWith(":") ? "center" : c.endsWith(":") ? "right" : "");
  const row = (line, tag) => {
    const tr = el("tr");
    cells(line).forEach((text, k) => {
      const cell = el(tag);
      if (align[k]) cell.style.textAlign = align[k];
      renderInline(text, cell);
      tr.append(cell);
    });
    return tr;
  };
  const thead = el("thead");
  thead.append(row(lines[0], "th"));
  const tbody = el("tbody");
  for (const line of lines.slice(2)) tbody.append(row(line, "td"));
  t.append(thead, tbody);
  const wrap = el("div", "table-wrap");
  wrap.append(t);
  return wrap;
}

function list(lines, i, out) {
  const first = lines[i].match(ITEM);
  const ordered = /\d/.test(first[2]);
  const l = el(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) l.start = parseInt(first[2], 10);
  let items = [];
  let current = null;
  for (; i < lines.length; i++) {
    const line = lines[i];
    const m = line.match(ITEM);
    if (m && m[1].length < 2 && /\d/.test(m[2]) === ordered) {
      current = [m[4]];
      items.push(current);
    } else if (current && (/^\s/.test(line) || (!isBlockStart(line) && line.trim()))) {
      current.push(line.replace(/^ {1,4}/, ""));  // a nested block or a lazy continuation
    } else break;
  }
  for (const body of items) {
    const li = el("li");
    const inner = body.join("\n");
    const task = inner.match(/^\[([ xX])\]\s+/);
    if (task) {
      li.className = "task";
      li.append(task[1] === " " ? "☐ " : "☑ ");
    }
    const rest = task ? inner.slice(task[0].length) : inner;
    if (body.length === 1 || !body.slice(1).some((b) => isBlockStart(b.trimStart()))) {
      renderInline(rest, li);
    } else {
      li.append(renderBlocks(rest));
    }
    l.append(li);
  }
  out.append(l);
  return i;
}

/** A fragment of the block-level Markdown in ``text``. */
export function renderBlocks(text) {
  const out = document.createDocumentFragment();
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) { i++; continue; }
    let m;
    if ((m = line.match(FENCE))) {
      const [, fence, lang] = m;
      const body = [];
      for (i++; i < lines.length; i++) {
        const t = lines[i].trim();
        if (t.startsWith(fence[0].repeat(fence.length)) && /^[`~]+$/.test(t) && t[0] === fence[0]) { i++; break; }
        body.push(lines[i]);
      }
      out.append(codeBlock(body.join("\n"), lang));
      continue;
    }
    if ((m = line.match(HEADING))) {
      const h = el(`h${m[1].length}`);
      renderInline(m[2] || "", h);
      out.append(h);
      i++;
      continue;
    }
    if (RULE.test(line)) {
      out.append(el("hr"));
      i++;
      continue;
    }
    if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && lines[i].trim() && (m = lines[i].match(QUOTE) || [null, lines[i]])) {
        body.push(m[1]);
        i++;
      }
      const q = el("blockquote");
      q.append(renderBlocks(body.join("\n")));
      out.append(q);
      continue;
    }
    if (ITEM.test(line) && line.match(ITEM)[4] !== undefined) {
      i = list(lines, i, out);
      continue;
    }
    if (line.includes("|") && i + 1 < lines.length && TABLE_RULE.test(lines[i + 1])
        && lines[i + 1].includes("-")) {
      const rows = [line, lines[i + 1]];
      for (i += 2; i < lines.length && lines[i].includes("|") && lines[i].trim(); i++) rows.push(lines[i]);
      out.append(table(rows));
      continue;
    }
    const para = [line];
    for (i++; i < lines.length && lines[i].trim() && !isBlockStart(lines[i]); i++) para.push(lines[i]);
    const p = el("p");
    renderInline(para.join("\n"), p);
    out.append(p);
  }
  return out;
}

/** Offsets where the complete chunks of ``text`` end: after a blank line outside a fence. */
export function chunkEnds(text) {
  const ends = [];
  let fence = null;
  let pos = 0;
  let sawContent = false;
  for (const line of text.split("\n")) {
    const next = pos + line.length + 1;
    if (next > text.length) break;  // the last line has no newline yet: still open
    const m = line.match(FENCE);
    const t = line.trim();
    if (fence) {
      if (t.startsWith(fence) && /^[`~]+$/.test(t) && t[0] === fence[0]) fence = null;
    } else if (m) {
      fence = m[1];
    } else if (!t && sawContent) {
      ends.push(next);
      sawContent = false;
    }
    if (t) sawContent = true;
    pos = next;
  }
  return ends;
}

/** Renders text that grows (a streamed answer) into ``container`` block by block. */
export class StreamingMarkdown {
  constructor(container) {
    this.container = container;
    this.source = "";
    this.frozen = 0;  // source offset up to which blocks are final and rendered
    this.live = null;
    this.scheduled = false;
  }

  /** Adds ``delta`` to the source; the DOM follows at the next animation frame. */
  append(delta) {
    this.source += delta;
    if (!this.scheduled) {
      this.scheduled = true;
      requestAnimationFrame(() => {
        this.scheduled = false;
        this.render();
      });
    }
  }

  /** Brings the DOM up to date with the source now. */
  render() {
    const rest = this.source.slice(this.frozen);
    let start = 0;
    for (const end of chunkEnds(rest)) {
      const done = el("div", "md-chunk");
      done.append(renderBlocks(rest.slice(start, end)));
      if (this.live) this.live.before(done);
      else this.container.append(done);
      start = end;
    }
    this.frozen += start;
    const open = el("div", "md-chunk");
    open.append(renderBlocks(rest.slice(start)));
    if (this.live) this.live.replaceWith(open);
    else this.container.append(open);
    this.live = open;
  }
}

/** Renders complete Markdown ``text`` into ``container`` (replacing what it held). */
export function renderMarkdown(container, text) {
  const md = new StreamingMarkdown(container);
  container.replaceChildren();
  md.source = text;
  md.render();
  return md;
}
