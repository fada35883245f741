// Conversations, settings and the API key, kept in this browser's localStorage.

const KEYS = {
  conversations: "tallow-ui:conversations",
  current: "tallow-ui:current",
  settings: "tallow-ui:settings",
  apiKey: "tallow-ui:api-key",
};

export const DEFAULT_SETTINGS = {
  model: "",
  system: "",
  temperature: "",
  topP: "",
  maxTokens: "",
  structured: false,
  schema: "",
  serverTools: false,
};

function read(key, fallback) {
  try {
    const raw = localStorage.getItem(key);
    return raw === null ? fallback : JSON.parse(raw);
  } catch {
    return fallback;  // unreadable (an older format, a hand edit): start afresh
  }
}

function write(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
    return true;
  } catch {
    return false;  // quota exceeded or storage disabled: the page still works, unsaved
  }
}

function newId() {
  return crypto.randomUUID ? crypto.randomUUID()
    : `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
}

export class Store {
  constructor() {
    const saved = read(KEYS.conversations, []);
    this.conversations = Array.isArray(saved)
      ? saved.filter((c) => c && typeof c.id === "string" && Array.isArray(c.messages)) : [];
    this.currentId = read(KEYS.current, null);
    this.settings = { ...DEFAULT_SETTINGS, ...read(KEYS.settings, {}) };
  }

  /** The conversations, the most recently updated first. */
  sorted() {
    return [...this.conversations].sort((a, b) => (b.updated || 0) - (a.updated || 0));
  }

  current() {
    return this.conversations.find((c) => c.id === this.currentId) || null;
  }

  create() {
    const now = Date.now();
    const conv = { id: newId(), title: "New chat", titled: false, created: now, updated: now,
                   messages: [] };
    this.conversations.push(conv);
    this.currentId = conv.id;
    this.save();
    return conv;
  }

  select(id) {
    this.currentId = id;
    write(KEYS.current, id);
  }

  rename(id, title) {
    const conv = this.conversations.find((c) => c.id === id);
    if (!conv || !title.trim()) return;
    conv.title = title.trim().slice(0, 200);
    conv.titled = true;
    this.save();
  }

  remove(id) {
    this.conversations = this.conversations.filter((c) => c.id !== id);
    if (this.currentId === id) this.currentId = this.sorted()[0]?.id || null;
    this.save();
  }

  /** Marks ``conv`` changed (its title follows its first message until renamed) and saves. */
  touch(conv) {
    conv.updated = Date.now();
    if (!conv.titled) {
      const first = conv.messages.find((m) => m.role === "user");
      if (first) {
        conv.title = first.content.trim().split("\n")[0].slice(0, 60)
          || (first.images?.length ? "Image" : "New chat");
      }
    }
    return this.save();
  }

  save() {
    write(KEYS.current, this.currentId);
    return write(KEYS.conversations, this.conversations);
  }

  saveSettings() {
    write(KEYS.settings, this.settings);
  }

  get apiKey() {
    return localStorage.getItem(KEYS.apiKey) || "";
  }

  set apiKey(value) {
    if (value) localStorage.setItem(KEYS.apiKey, value);
    else localStorage.removeItem(KEYS.apiKey);
  }
}
