/* GPT explorer: the page over gptkit/explorer.py's HTTP API.

   Plain ES2020, no build step, no framework. Every number shown comes from the API; the page only formats
   numbers, picks colours for them and subtracts two API numbers (the Read panel's differences). */

'use strict';

(() => {
  // ------------------------------------------------------------------------------------------ helpers

  const $ = (sel) => document.querySelector(sel);

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  const clamp01 = (x) => (Number.isFinite(x) ? Math.min(1, Math.max(0, x)) : 0);

  function oneLine(text) {
    return String(text).replace(/\s+/g, ' ').trim();
  }

  /** Show one line in a status area; error lines are red. */
  function setLine(sel, text, isError = false) {
    const node = typeof sel === 'string' ? $(sel) : sel;
    if (!node) return;
    node.textContent = text ? oneLine(text) : '';
    node.classList.toggle('error', Boolean(isError && text));
    node.title = text ? oneLine(text) : '';
  }

  function fmtP(p) {
    if (p === null || p === undefined || !Number.isFinite(p)) return '—';
    if (p === 0) return '0%';
    const pct = p * 100;
    if (pct >= 10) return pct.toFixed(0) + '%';
    if (pct >= 1) return pct.toFixed(1) + '%';
    if (pct >= 0.01) return pct.toFixed(2) + '%';
    return '<0.01%';
  }

  const fmtBits = (b) => (b === null || b === undefined || !Number.isFinite(b) ? '—' : b.toFixed(2));
  const fmtSigned = (d, digits = 2) => (d > 0 ? '+' : d < 0 ? '−' : '±') + Math.abs(d).toFixed(digits);
  const fmtInt = (n) => (n === null || n === undefined ? '—' : Number(n).toLocaleString('en-US'));

  /** What a chip shows: the token's text, or its visible label when the text is whitespace or empty. */
  const isBlank = (text) => text === '' || /^\s+$/.test(text);
  const shownText = (t) => (isBlank(t.text) ? t.label : t.text);
  const quoted = (t) => '“' + t.label + '”';

  // the shades: display mappings only, explained by the legends
  const PROB_RGB = '47, 95, 179';
  const ATT_RGB = '75, 63, 168';
  const SURPRISE_RGB = '214, 104, 24';
  const BETTER_RGB = '22, 128, 160';
  const WORSE_RGB = '196, 40, 92';

  const probAlpha = (p) => 0.04 + 0.86 * clamp01(p);
  const attAlpha = (w) => 0.92 * Math.sqrt(clamp01(w));
  const SURPRISE_FULL = 10; // bits at which the surprise shade is at its darkest
  const surpriseAlpha = (b) => 0.04 + 0.86 * clamp01(b / SURPRISE_FULL);
  const DIFF_FULL = 4; // bits of difference at which the difference shade is at its darkest
  const diffAlpha = (d) => 0.06 + 0.84 * clamp01(Math.abs(d) / DIFF_FULL);
  const rgba = (rgb, a) => `rgba(${rgb}, ${a.toFixed(3)})`;

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || 'monospace';
  }

  class ApiError extends Error {}

  /** One JSON request; an HTTP error or an {"error": ...} body becomes an ApiError with one line. */
  async function api(method, path, body, signal) {
    const opts = { method, headers: { Accept: 'application/json' }, signal };
    if (body !== undefined) {
      opts.headers['Content-Type'] = 'application/json';
      opts.body = JSON.stringify(body);
    }
    let res;
    try {
      res = await fetch(path, opts);
    } catch (e) {
      if (e && e.name === 'AbortError') throw e;
      throw new ApiError('cannot reach the explorer server (is explore.py still running?)');
    }
    const text = await res.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch (_) {
      data = null;
    }
    if (!res.ok) throw new ApiError(errorLine(res, data, text));
    if (data && typeof data === 'object' && !Array.isArray(data) && typeof data.error === 'string' && data.error) {
      throw new ApiError(data.error);
    }
    return data;
  }

  function errorLine(res, data, text) {
    if (data && typeof data.error === 'string') return oneLine(data.error);
    if (data && data.detail) {
      const d = Array.isArray(data.detail) ? data.detail[0] : data.detail;
      return oneLine(typeof d === 'string' ? d : (d && d.msg) || JSON.stringify(d));
    }
    const short = text && text.length < 200 ? ': ' + text : '';
    return oneLine(`the server answered ${res.status} ${res.statusText}${short}`);
  }

  /** The URL of a run's GET routes. */
  function runUrl(name, suffix = '') {
    const path = name.split('/').map(encodeURIComponent).join('/');
    return '/api/runs/' + path + suffix;
  }

  // ------------------------------------------------------------------------------------------ state

  const state = {
    runs: [],
    run: null, // the picked run's name
    info: null, // GET /api/runs/{name}
    infoPromise: null,
    pickSeq: 0,
    metrics: null,
    chart: null,
    xaxis: 'iter',
    gen: null, // the AbortController of the running generation
    chips: [], // {id, text, label, p, p_shaped, gen}
    pinned: null, // index of the pinned chip
    shown: null, // {index, run, idsKey, key, window, data}: what the inspector panels show
    posSeq: 0,
    hoverTimer: 0,
    knobTimer: 0,
    cache: new Map(),
    selectedHead: null, // {layer, head}
    mapSeq: 0,
    map: null, // geometry of the drawn attention map, for its hover readout
    cellLayout: null, // geometry of the tokens in the attention cells
    readSeq: 0,
  };

  // ------------------------------------------------------------------------------------------ runs

  async function loadRuns() {
    let data;
    try {
      data = await api('GET', '/api/runs');
    } catch (e) {
      $('#runs').textContent = '';
      setLine('#runs-status', e.message, true);
      return;
    }
    state.runs = Array.isArray(data && data.runs) ? data.runs : [];
    $('#root').textContent = (data && data.root) || '?';
    renderRuns();
    fillSecondRunPicker();
    const first = state.runs.find((r) => !r.error);
    if (!state.runs.length) setLine('#runs-status', 'no runs in this folder (a run folder holds best.pt or latest.pt)', true);
    else if (!first) setLine('#runs-status', 'none of these runs can be opened', true);
    else pickRun(first.name);
  }

  function renderRuns() {
    const box = $('#runs');
    box.textContent = '';
    for (const r of state.runs) {
      const b = el('button', 'run');
      b.type = 'button';
      b.dataset.name = r.name;
      b.setAttribute('role', 'listitem');
      b.append(el('span', 'run-name', r.name));
      if (r.error) {
        b.classList.add('broken');
        b.disabled = true;
        b.setAttribute('aria-disabled', 'true');
        b.append(el('span', 'run-error', r.error));
        b.title = 'this run cannot be opened: ' + oneLine(r.error);
      } else {
        if (r.settings) b.append(el('span', 'run-settings', r.settings));
        const stats = el('span', 'run-stats');
        const part = (before, bold, after) => {
          const s = el('span', 'nw');
          if (before) s.append(before);
          s.append(el('b', null, bold));
          if (after) s.append(after);
          return s;
        };
        const iters = r.iterations === null || r.iterations === undefined ? '—' : fmtInt(r.iterations);
        const loss = r.final_val_loss === null || r.final_val_loss === undefined ? '—' : r.final_val_loss.toFixed(4);
        stats.append(part('', fmtInt(r.params), ' parameters'), ' · ', part('', iters, ' iterations'), ' · ',
          part('val loss ', loss, ''));
        b.append(stats);
        if (r.tokenizer) b.append(el('span', 'run-stats', 'tokens: ' + r.tokenizer));
        b.addEventListener('click', () => pickRun(r.name));
      }
      box.append(b);
    }
  }

  function fillSecondRunPicker() {
    const sel = $('#read-run2');
    const keep = sel.value;
    sel.textContent = '';
    sel.append(new Option('(no second run)', ''));
    for (const r of state.runs) if (!r.error) sel.append(new Option(r.name, r.name));
    if ([...sel.options].some((o) => o.value === keep)) sel.value = keep;
  }

  function pickRun(name) {
    if (state.run === name && (state.info || state.infoPromise)) return state.infoPromise;
    const seq = ++state.pickSeq;
    stopGeneration('run');
    state.run = name;
    state.info = null;
    for (const b of document.querySelectorAll('#runs .run')) {
      const on = b.dataset.name === name;
      b.classList.toggle('selected', on);
      if (on) b.setAttribute('aria-current', 'true');
      else b.removeAttribute('aria-current');
    }
    const cur = $('#current-run');
    cur.textContent = 'picked: ';
    cur.append(el('b', null, name));
    $('#read-run1').textContent = name;
    $('#run-title').textContent = 'Picked run: ' + name;
    $('#run-note').hidden = true;
    renderFacts([['loading', 'the model…']]);
    setLine('#run-status', '');
    clearOutput('Picked ' + name + '. Type a prompt and press Generate.');
    clearReadOutput();
    loadMetrics(name, seq);
    state.infoPromise = (async () => {
      try {
        const info = await api('GET', runUrl(name));
        if (seq !== state.pickSeq) return null;
        state.info = info;
        renderInfo(info);
        return info;
      } catch (e) {
        if (seq !== state.pickSeq) return null;
        renderFacts([]);
        setLine('#run-status', e.message, true);
        setLine('#status', 'this run could not be loaded: ' + e.message, true);
        return null;
      }
    })();
    return state.infoPromise;
  }

  function renderFacts(rows) {
    const dl = $('#run-info');
    dl.textContent = '';
    for (const [k, v] of rows) {
      dl.append(el('dt', null, k));
      dl.append(el('dd', null, v));
    }
  }

  function renderInfo(info) {
    const plural = (n, w) => `${n} ${w}${n === 1 ? '' : 's'}`;
    renderFacts([
      ['settings', info.settings || '—'],
      ['shape', `${plural(info.n_layer, 'layer')} × ${plural(info.n_head, 'head')}`],
      ['context', `${fmtInt(info.block_size)} tokens`],
      ['attention', `${info.attention}${info.causal ? ', causal (sees only the past)' : ', not causal (sees the future too)'}`],
      ['vocabulary', `${fmtInt(info.vocab_size)} tokens (${info.tokenizer})`],
      ['decoding', info.decode || '—'],
    ]);
    const note = $('#run-note');
    note.hidden = !info.note;
    note.textContent = info.note || '';
    note.classList.toggle('cheat', info.causal === false);
    setLine('#run-status', '');
    setLine('#status', `Loaded ${info.name}. Type a prompt and press Generate (or Enter).`);
  }

  // ------------------------------------------------------------------------------------------ loss curves

  async function loadMetrics(name, seq) {
    setLine('#curves-status', 'loading the curves…');
    try {
      const m = await api('GET', runUrl(name, '/metrics'));
      if (seq !== state.pickSeq) return;
      state.metrics = m;
      drawCurves();
    } catch (e) {
      if (seq !== state.pickSeq) return;
      state.metrics = null;
      destroyChart();
      setLine('#curves-status', e.message, true);
    }
  }

  function destroyChart() {
    if (state.chart) state.chart.destroy();
    state.chart = null;
    $('#curves').textContent = '';
  }

  function drawCurves() {
    destroyChart();
    const m = state.metrics;
    if (!m) return;
    if (typeof window.uPlot !== 'function') {
      setLine('#curves-status', 'the chart library (static/vendor/uPlot.iife.min.js) did not load', true);
      return;
    }
    const x = state.xaxis;
    const train = Array.isArray(m.train) ? m.train : [];
    const evals = Array.isArray(m.eval) ? m.eval : [];
    // a run with no per-iteration records still has its evaluations' train loss
    const trainPoints = train.length ? train.map((r) => [r[x], r.loss]) : evals.map((r) => [r[x], r.train_loss]);
    const byX = new Map(); // a resumed run may log an x twice: the later record wins
    for (const [xv, y] of trainPoints) {
      if (xv === null || xv === undefined || y === null || y === undefined) continue;
      const row = byX.get(xv) || [null, null];
      row[0] = y;
      byX.set(xv, row);
    }
    for (const r of evals) {
      const xv = r[x];
      if (xv === null || xv === undefined || r.val_loss === null || r.val_loss === undefined) continue;
      const row = byX.get(xv) || [null, null];
      row[1] = r.val_loss;
      byX.set(xv, row);
    }
    const xs = [...byX.keys()].sort((a, b) => a - b);
    if (!xs.length) {
      setLine('#curves-status', 'this run has logged no losses yet');
      return;
    }
    const data = [xs, xs.map((k) => byX.get(k)[0]), xs.map((k) => byX.get(k)[1])];
    const xLabel = x === 'time' ? 'time (s)' : 'iteration';
    const lossValue = (u, v) => (v === null || v === undefined ? '—' : v.toFixed(4));
    const box = $('#curves');
    const opts = {
      width: Math.max(220, box.clientWidth || 300),
      height: 220,
      scales: { x: { time: false } },
      cursor: { drag: { x: true, y: false, setScale: true } },
      legend: { live: true },
      series: [
        { label: xLabel, value: (u, v) => (v === null || v === undefined ? '—' : x === 'time' ? v.toFixed(1) + ' s' : fmtInt(v)) },
        { label: 'train', stroke: '#5b84c4', width: 1, spanGaps: true, value: lossValue },
        { label: 'val', stroke: '#d9730d', width: 2, spanGaps: true, points: { show: true, size: 5, fill: '#d9730d' }, value: lossValue },
      ],
      axes: [
        { label: xLabel, labelSize: 18, size: 34 },
        { label: 'loss', labelSize: 18, size: 46 },
      ],
    };
    state.chart = new window.uPlot(opts, data, box);
    setLine('#curves-status', train.length ? '' : 'no per-iteration records: train is the evaluations\' train loss');
  }

  // ------------------------------------------------------------------------------------------ knobs

  function numberField(id, what, integer) {
    const raw = $(id).value.trim();
    const v = Number(raw);
    if (raw === '' || !Number.isFinite(v)) return { error: `${what}: type a number` };
    if (integer && !Number.isInteger(v)) return { error: `${what}: type a whole number` };
    return { value: v };
  }

  /** temperature, top_k, top_p as typed; the server checks their ranges and says what is wrong. */
  function readKnobs() {
    const t = numberField('#temperature', 'temperature', false);
    const k = numberField('#top-k', 'top-k', true);
    const p = numberField('#top-p', 'top-p', false);
    const bad = [t, k, p].find((f) => f.error);
    if (bad) return { error: bad.error };
    return { temperature: t.value, top_k: k.value, top_p: p.value };
  }

  function knobsInWords(k) {
    return `temperature ${k.temperature} · top-k ${k.top_k === 0 ? 'off' : k.top_k} · top-p ${k.top_p}`;
  }

  /** The stop text as sample.py reads --stop: \n, \t, \r and \\ stand for the characters. */
  function unescape(text) {
    const map = { n: '\n', t: '\t', r: '\r', '\\': '\\' };
    return text.replace(/\\([ntr\\])/g, (_, c) => map[c]);
  }

  function linkSlider(rangeId, numberId) {
    const range = $(rangeId);
    const num = $(numberId);
    range.addEventListener('input', () => {
      num.value = range.value;
      knobsChanged();
    });
    num.addEventListener('input', () => {
      const v = Number(num.value);
      if (num.value.trim() !== '' && Number.isFinite(v)) range.value = String(v);
      knobsChanged();
    });
  }

  /** A knob moved: the pinned (or shown) token's candidates are fetched again with the new knobs. */
  function knobsChanged() {
    clearTimeout(state.knobTimer);
    state.knobTimer = setTimeout(() => {
      const i = state.pinned !== null ? state.pinned : state.shown ? state.shown.index : null;
      if (i !== null) requestPosition(i);
    }, 160);
  }

  // ------------------------------------------------------------------------------------------ write

  function clearOutput(message) {
    state.chips = [];
    state.pinned = null;
    state.shown = null;
    state.posSeq++;
    placeholder($('#output'), 'The prompt\'s tokens and the model\'s tokens appear here. Hover a token to see why it was written; click to pin it.');
    if (message) setLine('#status', message);
    clearInspector();
  }

  function stopGeneration(why) {
    if (state.gen) {
      state.gen.why = why;
      state.gen.abort();
    }
  }

  function setGenerating(on) {
    $('#stop').disabled = !on;
    $('#generate').textContent = on ? 'Generate again' : 'Generate';
  }

  async function generate() {
    if (!state.run) {
      setLine('#status', 'pick a run first (in the list on the left)', true);
      return;
    }
    const knobs = readKnobs();
    if (knobs.error) {
      setLine('#status', knobs.error, true);
      return;
    }
    const seed = numberField('#seed', 'seed', true);
    const maxTokens = numberField('#max-tokens', 'max tokens', true);
    const bad = [seed, maxTokens].find((f) => f.error);
    if (bad) {
      setLine('#status', bad.error, true);
      return;
    }
    stopGeneration('restart');
    const ctrl = new AbortController();
    state.gen = ctrl;
    if (!state.info && state.infoPromise) {
      setLine('#status', 'loading the model…');
      await state.infoPromise; // a failed load said so in the run's card; generating may still work, or say why not
      if (state.gen !== ctrl) return;
    }
    let prompt = $('#prompt').value;
    const emptyPrompt = prompt === '';
    if (emptyPrompt) prompt = '\n'; // sample.py's default start
    const body = {
      run: state.run,
      prompt,
      temperature: knobs.temperature,
      top_k: knobs.top_k,
      top_p: knobs.top_p,
      seed: seed.value,
      max_tokens: maxTokens.value,
      stop: unescape($('#stop-text').value),
    };
    clearOutput(null);
    setGenerating(true);
    setLine('#status', emptyPrompt ? 'generating from a newline (the prompt is empty)…' : 'generating…');
    const counter = { tokens: 0, ended: false };
    try {
      const res = await fetch('/api/generate', {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', Accept: 'text/event-stream' },
        body: JSON.stringify(body),
        signal: ctrl.signal,
      });
      if (!res.ok) {
        const text = await res.text();
        let data = null;
        try {
          data = JSON.parse(text);
        } catch (_) {
          data = null;
        }
        throw new ApiError(errorLine(res, data, text));
      }
      if (!res.body || !res.body.getReader) throw new ApiError('this browser cannot read a streamed response');
      const reader = res.body.getReader();
      const decoder = new TextDecoder();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let m;
        while ((m = /\r?\n\r?\n/.exec(buf)) !== null) {
          const block = buf.slice(0, m.index);
          buf = buf.slice(m.index + m[0].length);
          handleEvent(block, counter);
        }
      }
      buf += decoder.decode();
      if (buf.trim()) handleEvent(buf, counter);
      if (!counter.ended) setLine('#status', `the stream ended early, after ${counter.tokens} tokens`, true);
    } catch (e) {
      if (e && e.name === 'AbortError') {
        if (ctrl.why === 'user') setLine('#status', `stopped after ${counter.tokens} token${counter.tokens === 1 ? '' : 's'}`);
      } else if (e instanceof ApiError) {
        setLine('#status', e.message, true);
      } else {
        setLine('#status', 'the stream broke off: ' + (e && e.message ? e.message : e), true);
      }
    } finally {
      if (state.gen === ctrl) {
        state.gen = null;
        setGenerating(false);
      }
    }
  }

  /** One server-sent event: its `data:` lines joined, parsed as JSON. */
  function handleEvent(block, counter) {
    const data = block
      .split(/\r?\n/)
      .filter((line) => line.startsWith('data:'))
      .map((line) => line.slice(5).replace(/^ /, ''))
      .join('\n');
    if (!data) return;
    let ev;
    try {
      ev = JSON.parse(data);
    } catch (_) {
      setLine('#status', 'the server sent an event this page cannot read', true);
      return;
    }
    if (ev.type === 'prompt') {
      addChips((ev.tokens || []).map((t) => ({ id: t.id, text: t.text, label: t.label, gen: false })));
    } else if (ev.type === 'token') {
      counter.tokens++;
      addChips([{ id: ev.id, text: ev.text, label: ev.label, p: ev.p, p_shaped: ev.p_shaped, gen: true }]);
      setLine('#status', `generating… ${counter.tokens} token${counter.tokens === 1 ? '' : 's'}`);
    } else if (ev.type === 'done') {
      counter.ended = true;
      const why = ev.reason === 'stop' ? 'it reached the stop text' : ev.reason === 'max_tokens' ? 'it reached max tokens' : ev.reason;
      setLine('#status', `done: ${counter.tokens} token${counter.tokens === 1 ? '' : 's'}, ended because ${why}. Hover or click a token.`);
    } else if (ev.type === 'error') {
      counter.ended = true;
      setLine('#status', ev.error || 'the generation failed', true);
    }
  }

  function addChips(tokens) {
    const out = $('#output');
    const hint = out.querySelector('.placeholder');
    if (hint) hint.remove();
    const atBottom = out.scrollHeight - out.scrollTop - out.clientHeight < 40;
    const frag = document.createDocumentFragment();
    for (const t of tokens) {
      const i = state.chips.length;
      state.chips.push(t);
      frag.append(makeChip(t, i));
      if (isBlank(t.text)) for (const ch of t.text) if (ch === '\n') frag.append(document.createElement('br'));
    }
    out.append(frag);
    if (atBottom) out.scrollTop = out.scrollHeight;
  }

  function makeChip(t, i) {
    const c = el('span', 'chip ' + (t.gen ? 'gen' : 'prompt'), shownText(t));
    c.dataset.index = String(i);
    c.dataset.id = String(t.id);
    if (isBlank(t.text)) c.classList.add('ws');
    if (t.gen) {
      const a = probAlpha(t.p);
      c.style.background = rgba(PROB_RGB, a);
      if (a > 0.5) c.classList.add('dark');
      c.title = `${quoted(t)}: the model gave it ${fmtP(t.p)}; after temperature/top-k/top-p ${fmtP(t.p_shaped)}`;
    } else {
      c.title = `${quoted(t)}: a token of your prompt`;
    }
    return c;
  }

  function chipNode(i) {
    return i === null || i === undefined ? null : $(`#output .chip[data-index="${i}"]`);
  }

  function markChips() {
    for (const c of document.querySelectorAll('#output .chip.pinned, #output .chip.shown')) c.classList.remove('pinned', 'shown');
    const p = chipNode(state.pinned);
    if (p) p.classList.add('pinned');
    const s = state.shown ? chipNode(state.shown.index) : null;
    if (s && s !== p) s.classList.add('shown');
  }

  function pin(i) {
    if (i < 0 || i >= state.chips.length) return;
    clearTimeout(state.hoverTimer);
    state.pinned = i;
    markChips();
    requestPosition(i);
  }

  // ------------------------------------------------------------------------------------------ inspector

  function placeholder(node, text) {
    node.textContent = '';
    node.append(el('p', 'placeholder', text));
  }

  function clearInspector() {
    const hint = 'Hover or click a token in the text above.';
    for (const id of ['#why', '#attention', '#lens']) {
      const node = $(id);
      delete node.dataset.ready;
      delete node.dataset.index;
      placeholder(node, hint);
    }
    $('#attention').style.gridTemplateColumns = '';
    $('#why-head').textContent = '';
    $('#why-note').hidden = true;
    $('#attention-note').hidden = true;
    for (const s of ['#why-status', '#attention-status', '#lens-status', '#attention-readout']) setLine(s, '');
    state.cellLayout = null;
    clearMap();
  }

  function clearMap() {
    state.mapSeq++;
    state.map = null;
    state.selectedHead = null;
    const canvas = $('#attention-map');
    delete canvas.dataset.ready;
    canvas.width = 10;
    canvas.height = 10;
    canvas.style.width = '10px';
    canvas.style.height = '10px';
    $('#map-title').textContent = "One head's map: click a cell above";
    setLine('#map-readout', '');
    setLine('#map-status', '');
  }

  /** The window the model reads around token i: at most block_size tokens, as many of them before i as fit,
      then the ones after it (a causal model's numbers at i do not depend on them; an encoder's do, and the
      attention panel shows it looking ahead). */
  function windowFor(i) {
    const block = state.info && state.info.block_size ? state.info.block_size : Infinity;
    const start = Math.max(0, i + 1 - block);
    const end = Math.min(state.chips.length, start + block);
    const ids = state.chips.slice(start, end).map((c) => c.id);
    return { start, end, ids, position: i - start };
  }

  function cacheGet(key) {
    if (!state.cache.has(key)) return undefined;
    const v = state.cache.get(key);
    state.cache.delete(key);
    state.cache.set(key, v);
    return v;
  }

  function cachePut(key, v) {
    state.cache.set(key, v);
    while (state.cache.size > 60) state.cache.delete(state.cache.keys().next().value);
  }

  /** Fetch (or reuse) POST /api/position for token i and draw the three panels. */
  async function requestPosition(i) {
    if (!state.run || i === null || i < 0 || i >= state.chips.length) return;
    const knobs = readKnobs();
    if (knobs.error) {
      setLine('#why-status', knobs.error, true);
      return;
    }
    const w = windowFor(i);
    const body = { run: state.run, ids: w.ids, position: w.position, temperature: knobs.temperature, top_k: knobs.top_k, top_p: knobs.top_p, k: 10 };
    const key = JSON.stringify(body);
    const idsKey = JSON.stringify([state.run, w.ids, w.position]);
    const shown = state.shown;
    if (shown && shown.key === key && shown.index === i) {
      markChips();
      if (state.pinned === i) refreshMapFor(i);
      return;
    }
    const sameToken = Boolean(shown && shown.index === i && shown.idsKey === idsKey);
    const seq = ++state.posSeq;
    delete $('#why').dataset.ready;
    if (!sameToken) {
      delete $('#attention').dataset.ready;
      delete $('#lens').dataset.ready;
    }
    let data = cacheGet(key);
    if (data === undefined) {
      const slow = setTimeout(() => {
        if (seq === state.posSeq) setLine('#why-status', 'asking the model…');
      }, 150);
      try {
        data = await api('POST', '/api/position', body);
        cachePut(key, data);
      } catch (e) {
        if (seq !== state.posSeq) return;
        for (const s of sameToken ? ['#why-status'] : ['#why-status', '#attention-status', '#lens-status']) setLine(s, e.message, true);
        return;
      } finally {
        clearTimeout(slow);
      }
    }
    if (seq !== state.posSeq) return;
    state.shown = { index: i, run: state.run, idsKey, key, window: w, data, knobs };
    markChips();
    setLine('#why-status', '');
    renderWhy(i, w, data, knobs);
    if (!sameToken) {
      setLine('#attention-status', '');
      setLine('#lens-status', '');
      renderAttention(i, w, data);
      renderLens(i, data);
    }
    if (state.pinned === i) refreshMapFor(i);
  }

  // --- why this token

  function renderWhy(i, w, data, knobs) {
    const why = data.why || {};
    const chip = state.chips[i];
    const token = data.token || chip;
    const head = $('#why-head');
    head.textContent = '';
    head.append(el('span', 'tok', token.label));
    head.append(el('span', 'sub', `token ${i + 1} of ${state.chips.length}${chip.gen ? ', written by the model' : ', from your prompt'}` +
      (w.start > 0 ? ` · the model reads a window of ${w.ids.length} tokens around it (its context)` : '')));
    if (why.surprise_bits !== null && why.surprise_bits !== undefined) {
      const s = el('span', 'big', `surprise: ${fmtBits(why.surprise_bits)} bits`);
      s.title = 'how surprised the model was to see this token, −log₂ of its probability: 1 bit = a coin flip, 0 = certain';
      head.append(s);
    }
    if (chip.gen) head.append(el('span', 'sub', `when written: the model gave it ${fmtP(chip.p)}, sampling ${fmtP(chip.p_shaped)} (with the knobs used then)`));

    const note = $('#why-note');
    note.hidden = !why.note;
    note.textContent = why.note || '';

    const box = $('#why');
    box.textContent = '';
    const raw = Array.isArray(why.raw) ? why.raw : [];
    const shaped = Array.isArray(why.shaped) ? why.shaped : [];
    if (!raw.length && !shaped.length) {
      box.append(el('p', 'placeholder', why.note ? 'No candidates to show for this token.' : 'The server sent no candidates.'));
    } else {
      box.append(barGroup('temperature 1 (the model)', `the ${raw.length} likeliest next tokens, as the model scores them`, raw, token, 'raw'));
      box.append(barGroup('after temperature/top-k/top-p', `what sampling draws from now: ${knobsInWords(knobs)}`, shaped, token, 'shaped'));
    }
    box.dataset.ready = '1';
    box.dataset.index = String(i);
  }

  /** A bar filled to probability p, shared by the candidate bars and the logit lens. */
  function probabilityTrack(p) {
    const track = el('span', 'track');
    const fill = el('span', 'fill');
    fill.style.display = 'block';
    fill.style.width = (100 * clamp01(p)).toFixed(2) + '%';
    track.append(fill);
    return track;
  }

  function barGroup(title, sub, list, token, cls) {
    const g = el('div', 'bar-group ' + cls);
    g.append(el('h3', null, title));
    g.append(el('p', 'sub', sub));
    for (const c of list) {
      const row = el('div', 'bar ' + cls);
      row.dataset.id = String(c.id);
      if (c.id === token.id) row.classList.add('actual');
      row.append(el('span', 'lab', c.label));
      row.append(probabilityTrack(c.p));
      row.append(el('span', 'val', fmtP(c.p)));
      row.title = `${quoted(c)}: ${fmtP(c.p)}${c.id === token.id ? ' (the token that was actually there)' : ''}`;
      g.append(row);
    }
    if (!list.some((c) => c.id === token.id)) {
      g.append(el('p', 'missing', `${quoted(token)}, the token actually there, is not among these ${list.length}.`));
    }
    return g;
  }

  // --- where it looked

  function renderAttention(i, w, data) {
    const att = data.attention || {};
    const grid = $('#attention');
    const note = $('#attention-note');
    note.hidden = !att.note;
    note.textContent = att.note || '';
    note.classList.toggle('cheat', Boolean(state.info && state.info.causal === false));
    grid.textContent = '';
    setLine('#attention-readout', '');
    const L = att.layers || 0;
    const H = att.heads || 0;
    const rows = Array.isArray(att.rows) ? att.rows : [];
    if (!L || !H || !rows.length) {
      grid.style.gridTemplateColumns = '';
      grid.append(el('p', 'placeholder', 'This model has no attention layers to show.'));
      state.cellLayout = null;
      clearMap();
      grid.dataset.ready = '1';
      grid.dataset.index = String(i);
      return;
    }
    grid.style.gridTemplateColumns = `max-content repeat(${H}, minmax(${H > 4 ? 130 : 180}px, 1fr))`;
    grid.append(el('span', 'att-corner'));
    for (let h = 0; h < H; h++) grid.append(el('span', 'att-head-label', `head ${h + 1}`));
    const labels = state.chips.slice(w.start, w.end).map((c) => c.label);
    const cells = [];
    for (let l = 0; l < L; l++) {
      grid.append(el('span', 'att-layer-label', `layer ${l + 1}`));
      for (let h = 0; h < H; h++) {
        const cell = el('div', 'head-cell');
        cell.dataset.layer = String(l);
        cell.dataset.head = String(h);
        cell.title = `layer ${l + 1}, head ${h + 1}: click to see this head's whole map`;
        if (state.selectedHead && state.selectedHead.layer === l && state.selectedHead.head === h) cell.classList.add('selected');
        const canvas = el('canvas');
        cell.append(canvas);
        grid.append(cell);
        cells.push({ cell, canvas, weights: (rows[l] && rows[l][h]) || [], l, h });
      }
    }
    const width = Math.max(120, cells[0].cell.clientWidth - 8 - 16); // padding, and room for a scrollbar
    const layout = layoutTokens(labels, width);
    state.cellLayout = { layout, labels, query: w.position };
    for (const c of cells) {
      drawCell(c.canvas, layout, labels, c.weights, w.position);
      c.cell.scrollTop = c.cell.scrollHeight; // the query token is the last: keep it in view
      const strongest = argmax(c.weights);
      if (strongest >= 0 && strongest < labels.length) {
        c.cell.title = `layer ${c.l + 1}, head ${c.h + 1}: most weight on “${labels[strongest]}” (${c.weights[strongest].toFixed(3)}); click to see this head's whole map`;
      }
    }
    grid.dataset.ready = '1';
    grid.dataset.index = String(i);
  }

  function argmax(xs) {
    let best = -1;
    for (let j = 0; j < xs.length; j++) if (best < 0 || xs[j] > xs[best]) best = j;
    return best;
  }

  let measureCtx = null;
  const widthCache = new Map();
  const CELL_FONT_PX = 12;
  const CELL_LINE = 18;

  function textWidth(text, font) {
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

  /** Where each token's box goes in a cell `width` pixels wide, flowing like text. */
  function layoutTokens(labels, width) {
    const font = `${CELL_FONT_PX}px ${cssVar('--mono')}`;
    const boxes = [];
    let x = 0;
    let y = 0;
    for (const lab of labels) {
      const w = Math.min(width, Math.ceil(textWidth(lab, font)) + 4);
      if (x > 0 && x + w > width) {
        x = 0;
        y += CELL_LINE;
      }
      boxes.push({ x, y, w });
      x += w + 1;
    }
    return { font, boxes, width, height: y + CELL_LINE };
  }

  function setupCanvas(canvas, cssW, cssH) {
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.max(1, Math.round(cssW * dpr));
    canvas.height = Math.max(1, Math.round(cssH * dpr));
    canvas.style.width = cssW + 'px';
    canvas.style.height = cssH + 'px';
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return ctx;
  }

  function drawCell(canvas, layout, labels, weights, query) {
    const ctx = setupCanvas(canvas, layout.width, layout.height);
    ctx.font = layout.font;
    ctx.textBaseline = 'middle';
    layout.boxes.forEach((b, j) => {
      const a = attAlpha(weights[j]);
      ctx.fillStyle = rgba(ATT_RGB, a);
      ctx.fillRect(b.x, b.y + 1, b.w, CELL_LINE - 2);
      ctx.fillStyle = a > 0.5 ? '#fff' : '#23252b';
      ctx.save();
      ctx.beginPath();
      ctx.rect(b.x, b.y, b.w, CELL_LINE);
      ctx.clip();
      ctx.fillText(labels[j], b.x + 2, b.y + CELL_LINE / 2 + 0.5);
      ctx.restore();
      if (j === query) {
        ctx.strokeStyle = '#111';
        ctx.lineWidth = 1.5;
        ctx.strokeRect(b.x + 0.75, b.y + 1.75, b.w - 1.5, CELL_LINE - 3.5);
      }
    });
  }

  function cellHover(ev) {
    const cell = ev.target.closest('.head-cell');
    const cl = state.cellLayout;
    if (!cell || !cl || !state.shown) return;
    const canvas = cell.querySelector('canvas');
    const r = canvas.getBoundingClientRect();
    const x = ev.clientX - r.left;
    const y = ev.clientY - r.top;
    const j = cl.layout.boxes.findIndex((b) => x >= b.x && x <= b.x + b.w && y >= b.y && y < b.y + CELL_LINE);
    const l = Number(cell.dataset.layer);
    const h = Number(cell.dataset.head);
    if (j < 0) {
      setLine('#attention-readout', `layer ${l + 1}, head ${h + 1}`);
      return;
    }
    const rows = state.shown.data.attention.rows;
    const wgt = rows[l] && rows[l][h] ? rows[l][h][j] : undefined;
    setLine('#attention-readout', `layer ${l + 1}, head ${h + 1}: “${cl.labels[cl.query]}” → “${cl.labels[j]}” weight ${wgt === undefined ? '—' : wgt.toFixed(4)}`);
  }

  // --- one head's map

  function selectCell(l, h) {
    state.selectedHead = { layer: l, head: h };
    for (const c of document.querySelectorAll('#attention .head-cell')) {
      c.classList.toggle('selected', Number(c.dataset.layer) === l && Number(c.dataset.head) === h);
    }
  }

  /** The pinned token changed: the selected head's map is fetched again for its window. */
  function refreshMapFor(i) {
    const sel = state.selectedHead;
    if (!sel || !state.shown || state.shown.index !== i) return;
    if (state.map && state.map.idsKey === state.shown.idsKey && state.map.layer === sel.layer && state.map.head === sel.head) return;
    loadMap(sel.layer, sel.head);
  }

  async function loadMap(l, h) {
    if (!state.shown) return;
    selectCell(l, h);
    const w = state.shown.window;
    const idsKey = state.shown.idsKey;
    const seq = ++state.mapSeq;
    const canvas = $('#attention-map');
    delete canvas.dataset.ready;
    setLine('#map-status', `loading layer ${l + 1}, head ${h + 1}…`);
    let data;
    try {
      data = await api('POST', '/api/attention_map', { run: state.run, ids: w.ids, layer: l, head: h });
    } catch (e) {
      if (seq === state.mapSeq) setLine('#map-status', e.message, true);
      return;
    }
    if (seq !== state.mapSeq) return;
    setLine('#map-status', '');
    drawMap(data, l, h, w.position, idsKey);
  }

  function drawMap(data, l, h, query, idsKey) {
    const weights = Array.isArray(data.weights) ? data.weights : [];
    const labels = Array.isArray(data.labels) ? data.labels : [];
    const T = weights.length;
    const canvas = $('#attention-map');
    $('#map-title').textContent = `Layer ${l + 1}, head ${h + 1}: each row is a token as the query (down), each column a token it may look at as the key (across); the outlined row is the pinned token`;
    if (!T) {
      setLine('#map-status', 'the map is empty');
      return;
    }
    const avail = Math.max(360, $('.map-scroll').clientWidth - 12);
    const cell = Math.max(2, Math.min(26, Math.floor((avail - 100) / T)));
    const showLabels = cell >= 10;
    const fontPx = cell >= 14 ? 12 : 10;
    const font = `${fontPx}px ${cssVar('--mono')}`;
    let labelW = 8;
    if (showLabels) for (const lab of labels) labelW = Math.max(labelW, Math.ceil(textWidth(lab, font)) + 8);
    labelW = Math.min(labelW, 100);
    const left = showLabels ? labelW : 8;
    const top = showLabels ? labelW : 8;
    const size = T * cell;
    const ctx = setupCanvas(canvas, left + size + 6, top + size + 6);
    ctx.fillStyle = '#fff';
    ctx.fillRect(0, 0, left + size + 6, top + size + 6);
    for (let q = 0; q < T; q++) {
      const row = weights[q] || [];
      for (let k = 0; k < T; k++) {
        const v = row[k];
        if (!v) continue;
        ctx.fillStyle = rgba(ATT_RGB, attAlpha(v));
        ctx.fillRect(left + k * cell, top + q * cell, cell, cell);
      }
    }
    ctx.strokeStyle = '#c9c5bc';
    ctx.lineWidth = 1;
    ctx.strokeRect(left - 0.5, top - 0.5, size + 1, size + 1);
    if (query >= 0 && query < T) {
      ctx.strokeStyle = '#111';
      ctx.lineWidth = 2;
      ctx.strokeRect(left - 1, top + query * cell - 1, size + 2, cell + 2);
    }
    if (showLabels) {
      ctx.font = font;
      ctx.fillStyle = '#23252b';
      ctx.textBaseline = 'middle';
      ctx.textAlign = 'right';
      for (let q = 0; q < T; q++) ctx.fillText(labels[q] || '', left - 4, top + q * cell + cell / 2, labelW - 6);
      for (let k = 0; k < T; k++) {
        ctx.save();
        ctx.translate(left + k * cell + cell / 2, top - 4);
        ctx.rotate(-Math.PI / 2);
        ctx.textAlign = 'left';
        ctx.fillText(labels[k] || '', 0, 0, labelW - 6);
        ctx.restore();
      }
    }
    state.map = { left, top, cell, T, weights, labels, layer: l, head: h, idsKey };
    canvas.dataset.ready = '1';
    canvas.dataset.layer = String(l);
    canvas.dataset.head = String(h);
    setLine('#map-readout', showLabels ? 'Point at a square for its weight.' : 'Too many tokens to label: point at a square for its tokens and weight.');
  }

  function mapHover(ev) {
    const m = state.map;
    if (!m) return;
    const r = ev.target.getBoundingClientRect();
    const k = Math.floor((ev.clientX - r.left - m.left) / m.cell);
    const q = Math.floor((ev.clientY - r.top - m.top) / m.cell);
    if (q < 0 || k < 0 || q >= m.T || k >= m.T) return;
    const v = (m.weights[q] || [])[k];
    setLine('#map-readout', `query ${q + 1} “${m.labels[q]}” → key ${k + 1} “${m.labels[k]}”: weight ${v === undefined || v === null ? '—' : v.toFixed(4)}`);
  }

  // --- logit lens

  function renderLens(i, data) {
    const box = $('#lens');
    box.textContent = '';
    const lens = Array.isArray(data.lens) ? data.lens : [];
    const next = state.chips[i + 1];
    const cap = el('p', 'hint');
    cap.append(`After ${quoted(state.chips[i])} (token ${i + 1}), `);
    cap.append(next ? `the token that came next was ${quoted(next)} (marked).` : 'nothing has come next yet.');
    box.append(cap);
    lens.forEach((row, r) => {
      const div = el('div', 'lens-row');
      if (r === lens.length - 1) div.classList.add('final');
      div.append(el('span', 'lens-name', row.name));
      const tops = el('div', 'lens-top');
      for (const t of (row.top || []).slice(0, 5)) {
        const item = el('div', 'lens-item');
        if (next && t.id === next.id) item.classList.add('next');
        item.append(el('span', 'lab', t.label));
        item.append(el('span', 'val', fmtP(t.p)));
        item.append(probabilityTrack(t.p));
        item.title = `${row.name}: ${quoted(t)} ${fmtP(t.p)}`;
        tops.append(item);
      }
      div.append(tops);
      box.append(div);
    });
    if (!lens.length) box.append(el('p', 'placeholder', 'The server sent no layers for the lens.'));
    box.dataset.ready = '1';
    box.dataset.index = String(i);
  }

  // ------------------------------------------------------------------------------------------ read a text

  function clearReadOutput() {
    state.readSeq++;
    $('#read-output').textContent = '';
    setLine('#read-status', '');
    $('#read-go').disabled = false;
  }

  async function readText() {
    if (!state.run) {
      setLine('#read-status', 'pick a run first', true);
      return;
    }
    const text = $('#read-text').value;
    if (!text) {
      setLine('#read-status', 'type or paste a text first', true);
      return;
    }
    const runA = state.run;
    const runB = $('#read-run2').value || null;
    const seq = ++state.readSeq;
    setLine('#read-status', runB ? `reading with ${runA} and ${runB}…` : `reading with ${runA}…`);
    $('#read-go').disabled = true;
    const asks = [api('POST', '/api/read', { run: runA, text })];
    if (runB) asks.push(api('POST', '/api/read', { run: runB, text }));
    const results = await Promise.allSettled(asks);
    if (seq !== state.readSeq) return;
    $('#read-go').disabled = false;
    setLine('#read-status', '');
    const out = $('#read-output');
    out.textContent = '';
    const pair = el('div', 'read-pair' + (runB ? '' : ' single'));
    pair.append(readRow(runA, results[0]));
    if (runB) pair.append(readRow(runB, results[1]));
    out.append(pair);
    if (runB && results[0].status === 'fulfilled' && results[1].status === 'fulfilled') {
      out.append(diffRow(runA, results[0].value, runB, results[1].value));
    }
    const failed = results.filter((r) => r.status === 'rejected').length;
    if (failed) setLine('#read-status', failed === results.length ? 'the text could not be read' : 'one run could not read the text', true);
  }

  function readRow(name, result) {
    const row = el('div', 'read-row');
    row.dataset.run = name;
    row.append(el('h3', null, name));
    if (result.status === 'rejected') {
      const e = result.reason;
      const line = el('p', 'line-status error', e && e.message ? e.message : String(e));
      row.append(line);
      return row;
    }
    const r = result.value;
    const totals = el('p', 'totals');
    totals.append(el('b', null, `${fmtBits(r.total_bits)} bits`));
    totals.append(' in all · ');
    totals.append(el('b', null, `${r.bits_per_char === null || r.bits_per_char === undefined ? '—' : r.bits_per_char.toFixed(3)} bits per character`));
    totals.append(` · ${fmtInt(r.chars)} characters, ${fmtInt((r.tokens || []).length)} tokens`);
    if (r.loss !== null && r.loss !== undefined) totals.append(` · loss ${r.loss.toFixed(4)} nats per token`);
    row.append(totals);
    const chips = el('div', 'chips');
    for (const t of r.tokens || []) {
      const b = t.surprise_bits;
      const c = el('span', 'chip read-chip', shownText(t));
      c.dataset.id = String(t.id);
      if (isBlank(t.text)) c.classList.add('ws');
      if (b === null || b === undefined) {
        c.classList.add('none');
        c.title = `${quoted(t)}: the first token, nothing before it to predict it from`;
      } else {
        const a = surpriseAlpha(b);
        c.style.background = rgba(SURPRISE_RGB, a);
        if (a > 0.55) c.classList.add('dark');
        c.title = `${quoted(t)}: ${fmtBits(b)} bits of surprise`;
        c.dataset.bits = String(b);
      }
      chips.append(c);
      if (isBlank(t.text)) for (const ch of t.text) if (ch === '\n') chips.append(document.createElement('br'));
    }
    row.append(chips);
    return row;
  }

  function diffRow(nameA, a, nameB, b) {
    const row = el('div', 'read-row diff');
    row.append(el('h3', null, `${nameB} minus ${nameA}, token by token`));
    const ta = a.tokens || [];
    const tb = b.tokens || [];
    const same = ta.length === tb.length && ta.every((t, j) => t.id === tb[j].id);
    if (!same) {
      row.append(el('p', 'totals', 'The two runs cut this text into different tokens, so there is no token-by-token difference: compare their bits per character above.'));
      return row;
    }
    const total = b.total_bits - a.total_bits;
    const totals = el('p', 'totals');
    totals.append(el('b', null, `${fmtSigned(total)} bits in all`));
    totals.append(total < 0 ? `: ${nameB} needs fewer bits (it predicts this text better)` : total > 0 ? `: ${nameB} needs more bits (it predicts this text worse)` : ': the same');
    row.append(totals);
    const legend = el('div', 'diff-legend');
    for (const [d, words] of [[-4, `${nameB} better (fewer bits)`], [-1, ''], [1, ''], [4, `${nameB} worse (more bits)`]]) {
      const s = el('span', 'swatch', fmtSigned(d, 0));
      const al = diffAlpha(d);
      s.style.background = rgba(d < 0 ? BETTER_RGB : WORSE_RGB, al);
      if (al > 0.55) s.classList.add('dark');
      legend.append(s);
      if (words) legend.append(el('span', null, words));
    }
    row.append(legend);
    const chips = el('div', 'chips');
    ta.forEach((t, j) => {
      const ba = t.surprise_bits;
      const bb = tb[j].surprise_bits;
      const c = el('span', 'chip read-chip', shownText(t));
      if (isBlank(t.text)) c.classList.add('ws');
      if (ba === null || ba === undefined || bb === null || bb === undefined) {
        c.classList.add('none');
        c.title = `${quoted(t)}: no prediction for the first token`;
      } else {
        const d = bb - ba;
        const al = diffAlpha(d);
        c.style.background = rgba(d < 0 ? BETTER_RGB : WORSE_RGB, al);
        if (al > 0.55) c.classList.add('dark');
        c.title = `${quoted(t)}: ${nameA} ${fmtBits(ba)} bits, ${nameB} ${fmtBits(bb)} bits, difference ${fmtSigned(d)}`;
        c.dataset.diff = String(d);
      }
      chips.append(c);
      if (isBlank(t.text)) for (const ch of t.text) if (ch === '\n') chips.append(document.createElement('br'));
    });
    row.append(chips);
    return row;
  }

  // ------------------------------------------------------------------------------------------ legends

  function swatch(text, rgb, alpha) {
    const s = el('span', 'swatch', text);
    s.style.background = rgba(rgb, alpha);
    if (alpha > 0.5) s.classList.add('dark');
    return s;
  }

  function drawLegends() {
    const prob = $('#prob-swatches');
    for (const p of [0.01, 0.1, 0.3, 0.6, 0.9]) prob.append(swatch(Math.round(p * 100) + '%', PROB_RGB, probAlpha(p)));
    prob.title = 'light = the model found the token unlikely (a surprise); dark = it expected it';
    const att = $('#att-swatches');
    for (const w of [0.01, 0.05, 0.2, 0.5, 1]) att.append(swatch(String(w), ATT_RGB, attAlpha(w)));
    const sur = $('#surprise-swatches');
    for (const b of [0.5, 1, 2, 4, 7, SURPRISE_FULL]) sur.append(swatch(b === SURPRISE_FULL ? `${b}+ bits` : b === 1 ? '1 bit' : `${b} bits`, SURPRISE_RGB, surpriseAlpha(b)));
  }

  // ------------------------------------------------------------------------------------------ wiring

  function wire() {
    $('#generate').addEventListener('click', () => generate());
    $('#stop').addEventListener('click', () => stopGeneration('user'));
    $('#prompt').addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing && !e.ctrlKey && !e.metaKey && !e.altKey) {
        e.preventDefault();
        generate();
      }
    });

    linkSlider('#temperature-range', '#temperature');
    linkSlider('#top-p-range', '#top-p');
    $('#top-k').addEventListener('input', knobsChanged);

    const out = $('#output');
    out.addEventListener('mouseover', (e) => {
      const c = e.target.closest('.chip');
      if (!c || !out.contains(c)) return;
      const i = Number(c.dataset.index);
      clearTimeout(state.hoverTimer);
      if (state.shown && state.shown.index === i) return;
      state.hoverTimer = setTimeout(() => requestPosition(i), 120);
    });
    out.addEventListener('mouseleave', () => {
      clearTimeout(state.hoverTimer);
      if (state.pinned !== null && (!state.shown || state.shown.index !== state.pinned)) requestPosition(state.pinned);
    });
    out.addEventListener('click', (e) => {
      const c = e.target.closest('.chip');
      if (c && out.contains(c)) pin(Number(c.dataset.index));
    });
    document.addEventListener('keydown', (e) => {
      if (state.pinned === null || e.ctrlKey || e.metaKey || e.altKey) return;
      const tag = (e.target && e.target.tagName) || '';
      if (['INPUT', 'TEXTAREA', 'SELECT', 'BUTTON'].includes(tag)) return;
      if (e.key === 'ArrowLeft' && state.pinned > 0) {
        e.preventDefault();
        pin(state.pinned - 1);
      } else if (e.key === 'ArrowRight' && state.pinned < state.chips.length - 1) {
        e.preventDefault();
        pin(state.pinned + 1);
      }
    });

    const grid = $('#attention');
    grid.addEventListener('click', (e) => {
      const cell = e.target.closest('.head-cell');
      if (cell) loadMap(Number(cell.dataset.layer), Number(cell.dataset.head));
    });
    grid.addEventListener('mousemove', cellHover);
    const map = $('#attention-map');
    map.addEventListener('mousemove', mapHover);

    for (const r of document.querySelectorAll('input[name="xaxis"]')) {
      r.addEventListener('change', () => {
        if (!r.checked) return;
        state.xaxis = r.value;
        drawCurves();
      });
    }

    $('#read-go').addEventListener('click', () => readText());
    $('#read-text').addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) {
        e.preventDefault();
        readText();
      }
    });

    let resizeTimer = 0;
    window.addEventListener('resize', () => {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(() => {
        if (state.chart) state.chart.setSize({ width: Math.max(220, $('#curves').clientWidth || 300), height: 220 });
        if (state.shown && $('#attention').dataset.ready) renderAttention(state.shown.index, state.shown.window, state.shown.data);
      }, 200);
    });
  }

  function start() {
    drawLegends();
    wire();
    loadRuns();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
