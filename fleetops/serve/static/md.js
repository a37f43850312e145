// A small, safe Markdown renderer for what models write: headings, paragraphs, emphasis,
// code spans, fenced code, lists, block quotes, rules and links. It parses the text into
// a tree of blocks and inline runs and builds DOM nodes from it with createElement and
// textContent only: no HTML string is ever parsed, so `<img onerror=...>`, `<script>` or
// any raw HTML in a model's answer shows as the text it is. A link becomes an <a> only
// when its URL parses as http: or https: (never javascript:, data:, vbscript: or a
// relative URL); any other stays the literal `[text](url)`.
"use strict";

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+-]*)\s*$/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const BULLET = /^ {0,3}[-*+]\s+(.*)$/;
const NUMBERED = /^ {0,3}(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^ {0,3}>\s?(.*)$/;
const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
const CLOSING = /^ {0,3}(`{3,}|~{3,})\s*$/;
const MAX_DEPTH = 8; // nested quotes and emphasis: a hostile text cannot recurse deeply

// Whether `line` closes a fence opened with `open` (the same mark, at least as long).
function closes(line, open) {
  const m = CLOSING.exec(line);
  return Boolean(m) && m[1][0] === open[0] && m[1].length >= open.length;
}

// The blocks of `text`: [{type, ...}] (pure: the tests and the renderer share it).
export function parseBlocks(text, depth) {
  const lines = String(text === null || text === undefined ? "" : text).replace(/\r\n?/g, "\n").split("\n");
  const blocks = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (!line.trim()) { i += 1; continue; }
    if ((m = FENCE.exec(line))) {
      const close = m[1];
      const body = [];
      i += 1;
      while (i < lines.length && !closes(lines[i], close)) {
        body.push(lines[i]);
        i += 1;
      }
      i += 1; // the closing fence (or the end)
      blocks.push({ type: "code", lang: m[2], text: body.join("\n") });
    } else if ((m = HEADING.exec(line))) {
      blocks.push({ type: "heading", level: m[1].length, text: m[2] });
      i += 1;
    } else if (RULE.test(line)) {
      blocks.push({ type: "rule" });
      i += 1;
    } else if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && (m = QUOTE.exec(lines[i]))) { body.push(m[1]); i += 1; }
      const inner = (depth || 0) < MAX_DEPTH ? parseBlocks(body.join("\n"), (depth || 0) + 1)
        : [{ type: "paragraph", text: body.join("\n") }];
      blocks.push({ type: "quote", blocks: inner });
    } else if (BULLET.test(line) || NUMBERED.test(line)) {
      const ordered = !BULLET.test(line);
      const pattern = ordered ? NUMBERED : BULLET;
      const items = [];
      const start = ordered ? Number(NUMBERED.exec(line)[1]) : 1;
      while (i < lines.length && (m = pattern.exec(lines[i]))) {
        let item = ordered ? m[2] : m[1];
        i += 1;
        while (i < lines.length && /^ {2,}\S/.test(lines[i]) && !pattern.test(lines[i])) {
          item += "\n" + lines[i].trim();
          i += 1;
        }
        items.push(item);
      }
      blocks.push({ type: "list", ordered, start, items });
    } else {
      const body = [];
      while (i < lines.length && lines[i].trim() && !FENCE.test(lines[i]) && !HEADING.test(lines[i])
        && !BULLET.test(lines[i]) && !NUMBERED.test(lines[i]) && !QUOTE.test(lines[i]) && !RULE.test(lines[i])) {
        body.push(lines[i]);
        i += 1;
      }
      blocks.push({ type: "paragraph", text: body.join("\n") });
    }
  }
  return blocks;
}

const INLINE = /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)|\*\*(?=\S)([\s\S]*?\S)\*\*|__(?=\S)([\s\S]*?\S)__|\*(?=[^\s*])([\s\S]*?[^\s*])\*|(?<![\w])_(?=[^\s_])([\s\S]*?[^\s_])_(?![\w])|\[([^\]\n]{1,500})\]\(\s*<?([^\s)>]{1,2000})>?\s*\)/;

// The inline runs of `text`: [{type: text|code|strong|em|link, ...}].
export function parseInline(text, depth) {
  const runs = [];
  let rest = String(text);
  while (rest) {
    const m = INLINE.exec(rest);
    if (!m) { runs.push({ type: "text", text: rest }); break; }
    if (m.index) runs.push({ type: "text", text: rest.slice(0, m.index) });
    const deeper = (depth || 0) < MAX_DEPTH;
    const inner = (s) => (deeper ? parseInline(s, (depth || 0) + 1) : [{ type: "text", text: s }]);
    if (m[1] !== undefined) runs.push({ type: "code", text: m[2].replace(/^ (.*) $/, "$1") });
    else if (m[3] !== undefined || m[4] !== undefined) runs.push({ type: "strong", runs: inner(m[3] !== undefined ? m[3] : m[4]) });
    else if (m[5] !== undefined || m[6] !== undefined) runs.push({ type: "em", runs: inner(m[5] !== undefined ? m[5] : m[6]) });
    else {
      const href = safeHref(m[8]);
      runs.push(href ? { type: "link", href, runs: inner(m[7]) } : { type: "text", text: m[0] });
    }
    rest = rest.slice(m.index + m[0].length);
  }
  return runs;
}

// The URL if it is an absolute http(s) URL, else null.
export function safeHref(raw) {
  let url;
  try {
    url = new URL(raw);
  } catch (error) {
    return null;
  }
  return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
}

function inlineNodes(parent, runs) {
  for (const run of runs) {
    if (run.type === "text") parent.append(document.createTextNode(run.text));
    else if (run.type === "code") parent.append(node("code", run.text));
    else if (run.type === "link") {
      const a = document.createElement("a");
      a.href = run.href;
      a.rel = "noopener noreferrer nofollow";
      a.target = "_blank";
      inlineNodes(a, run.runs);
      parent.append(a);
    } else {
      const box = document.createElement(run.type === "strong" ? "strong" : "em");
      inlineNodes(box, run.runs);
      parent.append(box);
    }
  }
  return parent;
}

function node(tag, text) {
  const out = document.createElement(tag);
  if (text !== undefined) out.textContent = text;
  return out;
}

function blockNodes(parent, blocks) {
  for (const block of blocks) {
    if (block.type === "code") {
      const pre = node("pre");
      const code = node("code", block.text);
      if (block.lang) code.dataset.lang = block.lang;
      pre.append(code);
      parent.append(pre);
    } else if (block.type === "heading") {
      parent.append(inlineNodes(node("h" + Math.min(6, block.level + 2)), parseInline(block.text)));
    } else if (block.type === "rule") {
      parent.append(node("hr"));
    } else if (block.type === "quote") {
      parent.append(blockNodes(node("blockquote"), block.blocks));
    } else if (block.type === "list") {
      const list = node(block.ordered ? "ol" : "ul");
      if (block.ordered && block.start !== 1) list.start = block.start;
      for (const item of block.items) list.append(inlineNodes(node("li"), parseInline(item)));
      parent.append(list);
    } else {
      const p = node("p");
      block.text.split("\n").forEach((line, index) => {
        if (index) p.append(node("br"));
        inlineNodes(p, parseInline(line));
      });
      parent.append(p);
    }
  }
  return parent;
}

// `text` as Markdown, in a <div class="md">: DOM nodes only, never parsed as HTML.
export function renderMarkdown(text, className) {
  const box = node("div");
  box.className = "md" + (className ? " " + className : "");
  return blockNodes(box, parseBlocks(text));
}
