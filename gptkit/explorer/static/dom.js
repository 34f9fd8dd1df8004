/* Small DOM and canvas helpers every panel uses. */

export const $ = (sel) => document.querySelector(sel);

export function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

export function oneLine(text) {
  return String(text).replace(/\s+/g, ' ').trim();
}

/** Show one line in a status area; error lines are red. */
export function setLine(sel, text, isError = false) {
  const node = typeof sel === 'string' ? $(sel) : sel;
  if (!node) return;
  node.textContent = text ? oneLine(text) : '';
  node.classList.toggle('error', Boolean(isError && text));
  node.title = text ? oneLine(text) : '';
}

export function placeholder(node, text) {
  node.textContent = '';
  node.append(el('p', 'placeholder', text));
}

export const clamp01 = (x) => (Number.isFinite(x) ? Math.min(1, Math.max(0, x)) : 0);

/** A bar filled to probability p, shared by the candidate bars and the logit lens. */
export function probabilityTrack(p) {
  const track = el('span', 'track');
  const fill = el('span', 'fill');
  fill.style.display = 'block';
  fill.style.width = (100 * clamp01(p)).toFixed(2) + '%';
  track.append(fill);
  return track;
}

/** The monospace font the stylesheet uses, for text measured or drawn in JavaScript. */
export function monoFont(px) {
  const family = getComputedStyle(document.documentElement).getPropertyValue('--mono').trim() || 'monospace';
  return `${px}px ${family}`;
}

let measureCtx = null;
const widthCache = new Map(); // the grid measures the same few labels for every cell

export function textWidth(text, font) {
  const key = font + '\u0000' + text;
  let wd = widthCache.get(key);
  if (wd === undefined) {
    if (!measureCtx) measureCtx = document.createElement('canvas').getContext('2d');
    measureCtx.font = font;
    wd = measureCtx.measureText(text).width;
    if (widthCache.size > 20000) widthCache.clear();
    widthCache.set(key, wd);
  }
  return wd;
}

/** Size a canvas in CSS pixels, drawn at the screen's pixel density so that text stays sharp. */
export function setupCanvas(canvas, cssW, cssH) {
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.max(1, Math.round(cssW * dpr));
  canvas.height = Math.max(1, Math.round(cssH * dpr));
  canvas.style.width = cssW + 'px';
  canvas.style.height = cssH + 'px';
  const ctx = canvas.getContext('2d');
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return ctx;
}
