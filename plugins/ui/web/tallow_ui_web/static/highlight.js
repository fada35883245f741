// Syntax highlighting for code blocks: a small tokenizer per language family that wraps
// comments, strings, numbers, keywords and called names in <span class="tok-…">. It builds
// DOM text nodes only (never HTML strings), so code can hold anything.

const WORDS = {
  python: "and as assert async await break class continue def del elif else except False finally for from global if import in is lambda None nonlocal not or pass raise return True try while with yield match case self print len range",
  js: "async await break case catch class const continue debugger default delete do else export extends false finally for function if import in instanceof let new null of return static super switch this throw true try typeof undefined var void while with yield interface type enum implements private public protected readonly",
  c: "auto bool break case char const continue default do double else enum extern false float for goto if inline int long namespace new nullptr private protected public register return short signed sizeof static struct switch template this throw true try typedef union unsigned using virtual void volatile while class include define fn let mut impl trait pub use mod match loop crate self Self func package var type interface map chan go defer range select struct import final extends implements String",
  shell: "if then else elif fi for while do done case esac in function return export local echo exit set unset source cd sudo",
  sql: "select from where and or not insert into values update set delete create table drop alter index join left right inner outer on group by order having limit offset as distinct null is in like between union all primary key foreign references",
  json: "true false null",
};

const ALIASES = {
  py: "python", python: "python", python3: "python",
  js: "js", javascript: "js", ts: "js", typescript: "js", jsx: "js", tsx: "js", mjs: "js",
  c: "c", h: "c", cpp: "c", "c++": "c", cc: "c", hpp: "c", java: "c", go: "c", rust: "c", rs: "c",
  cs: "c", csharp: "c", kotlin: "c", swift: "c", scala: "c",
  sh: "shell", bash: "shell", shell: "shell", zsh: "shell", console: "shell",
  sql: "sql", json: "json", jsonc: "json",
};

const NUMBER = String.raw`\b(?:0[xX][0-9a-fA-F_]+|\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?)\b`;
const DQ = String.raw`"(?:[^"\\\n]|\\.)*"?`;
const SQ = String.raw`'(?:[^'\\\n]|\\.)*'?`;
const BT = String.raw`\x60(?:[^\x60\\]|\\.)*\x60?`;

// comment / string patterns per family; each family's regex has the groups
// (comment)(string)(number)(word)
const FAMILIES = {
  python: { comment: String.raw`#[^\n]*`, string: String.raw`"""[\s\S]*?(?:"""|$)|'''[\s\S]*?(?:'''|$)|[rbfu]{0,2}${DQ}|[rbfu]{0,2}${SQ}` },
  js: { comment: String.raw`\/\/[^\n]*|\/\*[\s\S]*?(?:\*\/|$)`, string: `${DQ}|${SQ}|${BT}` },
  c: { comment: String.raw`\/\/[^\n]*|\/\*[\s\S]*?(?:\*\/|$)|^\s*#[^\n]*`, string: `${DQ}|${SQ}` },
  shell: { comment: String.raw`(?:^|(?<=\s))#[^\n]*`, string: `${DQ}|${SQ}` },
  sql: { comment: String.raw`--[^\n]*`, string: `${SQ}|${DQ}` },
  json: { comment: String.raw`\/\/[^\n]*`, string: DQ },
  plain: { comment: String.raw`(?!)`, string: `${DQ}|${SQ}` },
};

const compiled = new Map();

function tokenizer(family) {
  if (!compiled.has(family)) {
    const f = FAMILIES[family];
    const pattern = `(${f.comment})|(${f.string})|(${NUMBER})|([A-Za-z_$][\\w$]*)`;
    const words = new Set((WORDS[family] || "").split(" ").filter(Boolean));
    const caseless = family === "sql";
    compiled.set(family, { re: new RegExp(pattern, "gm"), words, caseless });
  }
  return compiled.get(family);
}

/** The family a fence's language name belongs to ("plain" when unknown). */
export function languageFamily(lang) {
  return ALIASES[(lang || "").toLowerCase()] || "plain";
}

function span(cls, text) {
  const s = document.createElement("span");
  s.className = cls;
  s.textContent = text;
  return s;
}

/** A fragment of text nodes and token spans for ``code`` in language ``lang``. */
export function highlight(code, lang) {
  const frag = document.createDocumentFragment();
  const family = languageFamily(lang);
  const { re, words, caseless } = tokenizer(family);
  re.lastIndex = 0;
  let last = 0;
  let m;
  while ((m = re.exec(code)) !== null) {
    if (m[0].length === 0) { re.lastIndex++; continue; }
    if (m.index > last) frag.append(code.slice(last, m.index));
    const [text, comment, string, number, word] = m;
    if (comment !== undefined) frag.append(span("tok-comment", text));
    else if (string !== undefined) frag.append(span("tok-string", text));
    else if (number !== undefined) frag.append(span("tok-number", text));
    else if (word !== undefined) {
      const key = caseless ? word.toLowerCase() : word;
      if (words.has(key)) frag.append(span("tok-keyword", text));
      else if (code[re.lastIndex] === "(") frag.append(span("tok-function", text));
      else frag.append(text);
    }
    last = re.lastIndex;
  }
  if (last < code.length) frag.append(code.slice(last));
  return frag;
}
