/* The console's DOM helpers: every value from an envelope becomes text (textContent), never HTML. */
"use strict";
(function () {
  /** el("td", {class: "x"}, "text", otherNode, ...): attributes set one by one, children as text or nodes. */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key.startsWith("on")) throw new Error("no inline handlers");
      node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function when(iso) {
    if (!iso) return "-";
    const d = new Date(iso);
    return isNaN(d) ? String(iso) : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z").replace(/Z$/, " UTC");
  }

  function span(seconds) {
    const s = Math.abs(Math.round(seconds));
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    return (h ? h + " h " : "") + (h || m ? m + " min " : "") + r + " s";
  }

  /** "in 12 min 3 s" or "passed 40 s ago" for NotBefore. */
  function countdown(iso, now) {
    if (!iso) return "no NotBefore";
    const left = (new Date(iso) - now) / 1000;
    return left >= 0 ? "in " + span(left) : "passed " + span(left) + " ago";
  }

  function ago(ms) { return span(ms / 1000) + " ago"; }

  function list(values) { return (values || []).map(String).join(", ") || "-"; }

  window.SE = { el, when, span, countdown, ago, list };
})();
