// Building DOM without HTML strings: every string given here becomes a text node or an attribute value,
// never markup, so job names, metric names, params and event messages are always shown as text.

/** h("div", {class: "x", onclick: fn, "aria-label": "y"}, "text", child, [more]) */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  if (attrs) setAttrs(el, attrs);
  append(el, children);
  return el;
}

const SVG = "http://www.w3.org/2000/svg";

/** An SVG element (sparklines). */
export function svg(tag, attrs) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  return el;
}

function setAttrs(el, attrs) {
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = String(value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "style") Object.assign(el.style, value);
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "checked" || key === "disabled" || key === "hidden" || key === "selected" || key === "value")
      el[key] = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.append(child);
    else el.append(document.createTextNode(String(child)));
  }
}

/** Replace an element's children. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** Set a text only when it changed (no needless layout, no flicker). */
export function setText(el, text) {
  const value = text === null || text === undefined ? "" : String(text);
  if (el.textContent !== value) el.textContent = value;
}

/** Set an attribute only when it changed. */
export function setAttr(el, name, value) {
  const v = String(value);
  if (el.getAttribute(name) !== v) el.setAttribute(name, v);
}

/** Escape text for the places that parse markup we do not control (plotly titles, trace names). */
export function escapeMarkup(text) {
  // without "<" no tag can start; plotly decodes these three entities (and not &quot;)
  return String(text).replace(/[&<>]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;" })[c]);
}
