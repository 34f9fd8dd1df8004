/* Talking to gptkit/explorer/app.py: every number the page shows comes through here. */

import { oneLine } from './dom.js';

export class ApiError extends Error {}

/** One JSON request; an HTTP error or an {"error": ...} body becomes an ApiError with one line. */
export async function api(method, path, body, signal) {
  const opts = { method, headers: { Accept: 'application/json' }, signal };
  if (body !== undefined) {
    opts.headers['Content-Type'] = 'application/json';
    opts.body = JSON.stringify(body);
  }
  const res = await reach(path, opts);
  const data = parseJson(await res.text());
  if (!res.ok) throw await refusal(res, data.text);
  if (data.json && typeof data.json === 'object' && !Array.isArray(data.json) && typeof data.json.error === 'string' && data.json.error) {
    throw new ApiError(data.json.error);
  }
  return data.json;
}

/** fetch(path, opts), with a server that cannot be reached (explore.py stopped) an ApiError in the page's words. */
export async function reach(path, opts) {
  try {
    return await fetch(path, opts);
  } catch (e) {
    if (e && e.name === 'AbortError') throw e;
    throw new ApiError('cannot reach the explorer server (is explore.py still running?)');
  }
}

function parseJson(text) {
  try {
    return { text, json: text ? JSON.parse(text) : null };
  } catch (_) {
    return { text, json: null };
  }
}

/** The ApiError for a response that is not ok, with the server's own line when it sent one. */
export async function refusal(res, text) {
  const body = text === undefined ? await res.text() : text;
  const data = parseJson(body).json;
  if (data && typeof data.error === 'string') return new ApiError(oneLine(data.error));
  const short = body && body.length < 200 ? ': ' + body : '';
  return new ApiError(oneLine(`the server answered ${res.status} ${res.statusText}${short}`));
}

/** The URL of a run's GET routes. */
export function runUrl(name, suffix = '') {
  const path = name.split('/').map(encodeURIComponent).join('/');
  return '/api/runs/' + path + suffix;
}
