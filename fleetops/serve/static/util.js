// Shared pieces of the page: DOM building, the API with its token and CSRF, formatting.
// Everything a model, a tool or a task wrote is untrusted: it reaches the page only as
// textContent (never parsed as HTML), ids only through encodeURIComponent, and no link is
// ever built from such text.
"use strict";

const TOKEN_KEY = "fleet-serve-token";
const session = { csrf: null };

export function $(id) { return document.getElementById(id); }

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

export function token() { return sessionStorage.getItem(TOKEN_KEY); }

export function saveToken(value) { sessionStorage.setItem(TOKEN_KEY, value); }

export function headers(extra) {
  const out = Object.assign({}, extra || {});
  const value = token();
  if (value) out.Authorization = "Bearer " + value;
  return out;
}

export function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

export async function api(path, options) {
  const opts = Object.assign({ cache: "no-store" }, options || {});
  opts.headers = headers(opts.headers);
  const response = await fetch(path, opts);
  if (response.status === 401) {
    $("auth").hidden = false;
    throw new Error("this service needs a bearer token");
  }
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

// An action: POST with the CSRF token of this service (fetched once, again after a 403).
export async function post(path, body) {
  for (let attempt = 0; attempt < 2; attempt += 1) {
    if (!session.csrf) session.csrf = (await api("/api/session")).csrf;
    try {
      return await api(path, {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-Fleet-CSRF": session.csrf },
        body: JSON.stringify(body || {}),
      });
    } catch (error) {
      if (attempt === 0 && /X-Fleet-CSRF/.test(error.message)) { session.csrf = null; continue; }
      throw error;
    }
  }
  throw new Error("the action was refused");
}

export function traceUrl(id, suffix) {
  return "/api/traces/" + encodeURIComponent(id) + (suffix || "");
}

export function pageUrl(root, open) {
  const params = new URLSearchParams({ trace: root });
  if (open && open !== root) params.set("open", open);
  return "?" + params.toString();
}

export function tokens(stats) {
  return (stats.prompt_tokens || 0) + (stats.completion_tokens || 0);
}

// Dollars as people read them: cents from a cent up, four places below it ($0.0031).
export function usd(value) {
  const n = Number(value || 0);
  return "$" + (n === 0 || Math.abs(n) >= 0.01 ? n.toFixed(2) : n.toFixed(4));
}

// A cost, or a visible "unpriced" mark when tokens were spent but nothing is known of the
// model's price (the scripted model, an alias without `pricing:` in fleet.yaml).
export function money(value, tokenCount) {
  if (Number(value || 0) === 0 && Number(tokenCount || 0) > 0) {
    const mark = el("span", "unpriced", "unpriced");
    mark.title = "no price known for this model: set pricing in fleet.yaml (cost counted as $0)";
    return mark;
  }
  return el("span", "money", usd(value));
}

// A whole number with thousands separators (tokens).
export function count(value) { return Number(value || 0).toLocaleString("en-US"); }

// `text` cut to at most `max` characters at a word, with an ellipsis when cut.
export function cut(text, max) {
  const flat = String(text || "").replace(/\s+/g, " ").trim();
  if (flat.length <= max) return flat;
  const head = flat.slice(0, max);
  const space = head.lastIndexOf(" ");
  return (space > max * 0.6 ? head.slice(0, space) : head).replace(/[\s.,;:]+$/, "") + "…";
}

export function duration(ms) {
  if (ms === null || ms === undefined || ms < 0) return "–";
  if (ms < 1000) return Math.round(ms) + " ms";
  const s = ms / 1000;
  if (s < 60) return s.toFixed(s < 10 ? 2 : 1) + " s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + " min " + Math.round(s % 60) + " s";
  return Math.floor(m / 60) + " h " + (m % 60) + " min";
}

export function size(chars) {
  return chars < 1024 ? chars + " B" : (chars / 1024).toFixed(1) + " KB";
}

export function clock(ms) {
  const d = new Date(ms);
  return d.toLocaleTimeString([], { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
}

// A field list (structured outputs, verdicts): keys and values as text, nested as JSON.
export function fields(object) {
  const list = el("dl", "fields");
  for (const [key, value] of Object.entries(object || {})) {
    const shown = typeof value === "string" ? value : JSON.stringify(value, null, 2);
    list.append(el("dt", null, key), el("dd", null, shown));
  }
  return list;
}

export function button(label, onClick, className) {
  const node = el("button", className || null, label);
  node.type = "button";
  node.addEventListener("click", onClick);
  return node;
}
