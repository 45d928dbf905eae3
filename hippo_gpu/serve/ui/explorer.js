// hippo-gpu explorer: asks POST /v1/explain and draws why each passage was retrieved.
// Plain JavaScript and SVG, no library. Every node is built from text (never from an HTML
// string), so nothing in a passage or a query can run here. The token goes only into the
// Authorization header of this server's /v1/* requests (kept in sessionStorage).
"use strict";

(() => {
  const SVG = "http://www.w3.org/2000/svg";
  const COLOURS = ["#1f6fb2", "#d9822b", "#2e8b57", "#b5476b", "#7b5ea7", "#8c6d31",
                   "#3f8f8f", "#c0392b"];
  const DENSE_OWN = "#9aa5b1";
  const DENSE_SPREAD = "#c8cfd6";
  const STORE = "hippo-gpu-token";
  const $ = (id) => document.getElementById(id);

  const state = { token: "", connected: false, data: null, hit: 0, body: null };

  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  // ------------------------------------------------------------------ DOM helpers

  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "text") node.textContent = String(v);
      else if (k === "dataset") Object.assign(node.dataset, v);
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c));
    return node;
  }

  function svg(tag, attrs = {}, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

  function fmt(x) {
    if (x === null || x === undefined) return "—";
    if (x === 0) return "0";
    const a = Math.abs(x);
    return a >= 1e-3 && a < 1e4 ? x.toPrecision(4) : x.toExponential(3);
  }

  function pct(x, of) { return of ? (100 * x / of).toFixed(1) + " %" : "—"; }

  function short(text, n) { return text.length > n ? text.slice(0, n - 1) + "…" : text; }

  function say(message, kind = "") {
    const s = $("status");
    s.textContent = message;
    s.className = "status " + kind;
  }

  // ------------------------------------------------------------------ the API

  async function api(path, body) {
    const headers = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (state.token && path.startsWith("/v1/")) headers.Authorization = "Bearer " + state.token;
    const response = await fetch(path, {
      method: body === undefined ? "GET" : "POST", headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const json = await response.json().catch(() => ({}));
    if (response.status === 401) {
      throw new ApiError(401, "Refused: this server needs its token. Enter it above and " +
                              "press Connect.");
    }
    if (!response.ok) {
      const detail = Array.isArray(json.detail)
        ? json.detail.map((d) => (d.loc || []).slice(1).join(".") + ": " + d.msg).join("; ")
        : json.detail || response.statusText;
      throw new ApiError(response.status, "Error " + response.status + ": " + detail);
    }
    return json;
  }

  async function loadContract() {
    // modes and limits from the (open) OpenAPI document, so the page follows the server
    let modes = ["hipporag2", "hybrid", "hipporag1", "dense"];
    try {
      const doc = await api("/openapi.json");
      const req = doc.components.schemas.ExplainRequest.properties;
      if (req.mode && req.mode.enum) modes = req.mode.enum;
      if (req.top_k && req.top_k.maximum) $("top-k").max = Math.min(100, req.top_k.maximum);
    } catch (e) { /* keep the defaults */ }
    const select = $("mode");
    clear(select);
    for (const m of modes) select.append(el("option", { value: m, text: m }));
  }

  async function connect() {
    state.connected = false;
    $("run").disabled = true;
    say("Connecting…");
    try {
      const body = await api("/v1/indexes");
      const select = $("index");
      clear(select);
      for (const ix of body.indexes) {
        select.append(el("option", { value: ix.name, text: `${ix.name} (${ix.passages} passages)` }));
      }
      state.connected = true;
      $("run").disabled = false;
      say(`Connected: ${body.indexes.length} index${body.indexes.length === 1 ? "" : "es"}.`,
          "ok");
    } catch (e) {
      say(e.message, "error");
    }
  }

  async function run(event) {
    event.preventDefault();
    if (!state.connected) await connect();
    if (!state.connected) return;
    const query = $("query").value.trim();
    if (!query) { say("Ask something first.", "error"); return; }
    const ents = $("entities").value.split(",").map((s) => s.trim()).filter(Boolean);
    const mode = $("mode").value;
    const body = { queries: [query], mode, top_k: Number($("top-k").value) || 10,
                   index: $("index").value || null };
    // no entities typed: the server links the question's capitalised spans (hipporag1, hybrid)
    if (ents.length) body.entities = [ents];
    say("Searching…");
    $("run").disabled = true;
    const t0 = performance.now();
    try {
      const answer = await api("/v1/explain", body);
      const data = answer.explanations[0];
      if (!data) throw new ApiError(500, (answer.errors || [])[0] || "no answer");
      state.data = data;
      state.body = body;
      renderQuery(data);
      selectHit(0, false);
      say(`${data.hits.length} hits in ${Math.round(performance.now() - t0)} ms` +
          (data.dense_answer ? " (answered by the dense ranking)" : "") + "." +
          entitiesNote(data), data.entities && !data.entities.length ? "warn" : "ok");
    } catch (e) {
      say(e.message, "error");
    } finally {
      $("run").disabled = !state.connected;
    }
  }

  function entitiesNote(data) {
    // hipporag1 and hybrid name the entities they linked: typed, or the question's capitalised spans
    if (!data.entities) return "";
    if (data.entities.length) return " Entities: " + data.entities.join(", ") + ".";
    return data.mode === "hipporag1"
      ? " No entity found in the question: every passage scores alike. Type its entities."
      : " No entity found in the question: no entity ranking was fused.";
  }

  // ------------------------------------------------------------------ rendering

  function phraseButton(phrase, node) {
    return el("button", { type: "button", class: "link phrase-link", text: phrase,
                          dataset: { node: String(node) },
                          "aria-label": `phrase ${phrase}: show its passages and synonyms`,
                          onclick: () => showPhrase(node) });
  }

  function seedColour(phrase) {
    const seeds = state.data ? state.data.seeds : [];
    const i = seeds.findIndex((s) => s.phrase === phrase);
    return COLOURS[(i < 0 ? seeds.length : i) % COLOURS.length];
  }

  function renderQuery(data) {
    const hits = $("hits");
    clear(hits);
    data.hits.forEach((h, i) => {
      const button = el("button", {
        type: "button", class: "hit", "aria-pressed": "false",
        dataset: { rank: String(h.rank), key: h.key, score: String(h.score), title: h.title },
        onclick: () => selectHit(i, true),
      }, el("span", { class: "hit-rank", text: `#${h.rank + 1}` }),
         el("span", { class: "hit-title", text: h.title }),
         el("span", { class: "hit-score", text: fmt(h.score) }));
      // the indexed text is "title\nbody": the title is already on the button
      const body = h.text.startsWith(h.title + "\n") ? h.text.slice(h.title.length + 1) : h.text;
      // the passage's own id and metadata, when its corpus item gave them
      const own = [h.id !== undefined ? `id ${h.id}` : "",
                   h.metadata !== undefined ? JSON.stringify(h.metadata) : ""].filter(Boolean);
      hits.append(el("li", {}, button, el("p", { class: "hit-text", text: body }),
                     own.length ? el("p", { class: "hit-label muted", text: own.join(" · ") }) : ""));
    });
    const seeds = $("seeds");
    clear(seeds);
    $("seeds-empty").hidden = data.seeds.length > 0;
    $("seeds-empty").textContent = data.dense_answer
      ? "None: the dense ranking answered this query." : "No seed.";
    data.seeds.forEach((s, i) => {
      const facts = el("ul", { class: "seed-facts" });
      for (const f of s.facts) facts.append(el("li", { text: `(${f.fact.join(", ")})` }));
      if (s.entities.length) facts.append(el("li", { text: "entities: " + s.entities.join(", ") }));
      const swatch = el("span", { class: "swatch", "aria-hidden": "true" });
      swatch.style.background = COLOURS[i % COLOURS.length];
      seeds.append(el("li", { dataset: { phrase: s.phrase, weight: String(s.weight) } },
        swatch, phraseButton(s.phrase, s.node),
        el("span", { class: "muted", text: ` weight ${fmt(s.weight)}, ${pct(s.share, 1)} of the mass` }),
        facts));
    });
    const facts = $("facts");
    clear(facts);
    for (const f of data.facts) {
      facts.append(el("li", { dataset: { row: String(f.row) } },
        el("span", { text: `(${f.fact.join(", ")})` }),
        el("span", { class: "muted", text: ` score ${fmt(f.score)}` })));
    }
    if (!data.facts.length) facts.append(el("li", { class: "muted", text: "none" }));
    $("phrase-body").replaceChildren(el("p", { class: "muted", text: "Select a phrase." }));
  }

  function selectHit(i, focus) {
    const data = state.data;
    if (!data || !data.hits.length) {
      $("detail").hidden = true;
      $("detail-empty").hidden = false;
      return;
    }
    state.hit = i;
    const buttons = $("hits").querySelectorAll("button.hit");
    buttons.forEach((b, j) => b.setAttribute("aria-pressed", j === i ? "true" : "false"));
    if (focus) buttons[i].focus();
    const h = data.hits[i];
    $("detail").hidden = false;
    $("detail-empty").hidden = true;
    $("detail").dataset.key = h.key;
    $("detail-title").textContent = `#${h.rank + 1} ${h.title}`;
    const what = h.fusion ? "its PPR value" : "its score";
    $("detail-summary").textContent = `${what} ${fmt(h.value)} = sum of the terms ` +
      `${fmt(h.total)} (certified to ±${fmt(h.bound)})`;
    renderTerms(h);
    renderBar(h);
    renderFusion(h);
    renderPaths(h);
  }

  function termsOf(h) {
    const terms = h.seeds.map((s) => ({ kind: "seed", label: s.phrase, node: s.node,
                                         value: s.contribution, colour: seedColour(s.phrase) }));
    if (h.dense) {
      terms.push({ kind: "dense-own", label: "dense prior: the passage's own",
                   value: h.dense.own, colour: DENSE_OWN });
      terms.push({ kind: "dense-spread", label: "dense prior: from other passages",
                   value: h.dense.spread, colour: DENSE_SPREAD });
    }
    if (h.offset) terms.push({ kind: "offset", label: "min-max shift", value: h.offset });
    return terms;
  }

  function renderTerms(h) {
    const body = $("terms").querySelector("tbody");
    clear(body);
    for (const t of termsOf(h)) {
      const name = t.kind === "seed" ? phraseButton(t.label, t.node) : el("span", { text: t.label });
      const swatch = el("span", { class: "swatch", "aria-hidden": "true" });
      if (t.colour) swatch.style.background = t.colour;
      body.append(el("tr", { dataset: { term: t.kind, label: t.label, value: String(t.value) } },
        el("td", {}, swatch, name), el("td", { class: "num", text: fmt(t.value) }),
        el("td", { class: "num", text: pct(t.value, h.value) })));
    }
  }

  function renderBar(h) {
    const bar = $("bar");
    clear(bar);
    const parts = termsOf(h).filter((t) => t.value > 0 && t.colour);
    const sum = parts.reduce((a, t) => a + t.value, 0);
    let x = 0;
    for (const t of parts) {
      const w = sum ? 1000 * t.value / sum : 0;
      const rect = svg("rect", { x, y: 4, width: Math.max(w, 0.5), height: 36, fill: t.colour });
      rect.append(svg("title", {}, `${t.label}: ${fmt(t.value)} (${pct(t.value, h.value)})`));
      bar.append(rect);
      x += w;
    }
    $("bar-text").textContent = parts.map((t) => `${t.label} ${pct(t.value, h.value)}`).join(", ");
  }

  function renderFusion(h) {
    const table = $("fusion");
    table.hidden = !h.fusion;
    const body = table.querySelector("tbody");
    clear(body);
    if (!h.fusion) return;
    const f = h.fusion;
    const rows = [["PPR", f.ppr_rank, f.ppr_term], ["dense", f.dense_rank, f.dense_term]];
    if (f.entity_rank !== null) rows.push(["entity", f.entity_rank, f.entity_term]);
    for (const [name, rank, term] of rows) {
      body.append(el("tr", { dataset: { ranking: name, rank: String(rank), value: String(term) } },
        el("td", { text: name }), el("td", { class: "num", text: `#${rank + 1}` }),
        el("td", { class: "num", text: fmt(term) })));
    }
  }

  function renderPaths(h) {
    const root = $("paths");
    clear(root);
    const seeds = h.seeds.filter((s) => s.contribution > 0).slice(0, 6);
    const bridges = new Map();  // node -> {phrase, mass}
    for (const s of seeds) {
      for (const b of s.bridges) {
        const cur = bridges.get(b.node) || { phrase: b.phrase, node: b.node, mass: 0 };
        cur.mass += b.mass;
        bridges.set(b.node, cur);
      }
    }
    const mid = [...bridges.values()].sort((a, b) => b.mass - a.mass).slice(0, 8);
    const keepMid = new Set(mid.map((b) => b.node));
    orderToUncross(seeds, mid, keepMid);
    const rows = Math.max(seeds.length, mid.length, 1);
    // lay out in the drawing's own pixels, so labels keep their size at any width
    const W = Math.max(420, Math.round(root.getBoundingClientRect().width) || 760);
    const box = Math.min(180, Math.round(W * 0.27));
    const chars = Math.max(8, Math.floor(box / 8));
    const xs = [box / 2 + 4, W / 2, W - box / 2 - 4];  // seeds, bridges, passage
    const height = Math.max(110, 38 * rows + 24);
    root.setAttribute("viewBox", `0 0 ${W} ${height}`);
    const yOf = (i, n) => (height / (n + 1)) * (i + 1);
    const maxMass = Math.max(...seeds.flatMap((s) => s.bridges.map((b) => b.mass)),
                             ...mid.map((b) => b.mass), 1e-300);
    const width = (m) => 1 + 13 * m / maxMass;
    const seedY = new Map(seeds.map((s, i) => [s.node, yOf(i, seeds.length)]));
    const midY = new Map(mid.map((b, i) => [b.node, yOf(i, mid.length)]));
    const passageY = height / 2;
    const edges = svg("g", { class: "edges" });
    for (const s of seeds) {
      for (const b of s.bridges) {
        if (!keepMid.has(b.node)) continue;
        const line = svg("path", {
          d: curve(xs[0] + box / 2, seedY.get(s.node), xs[1] - box / 2, midY.get(b.node)),
          "stroke-width": width(b.mass), stroke: seedColour(s.phrase), class: "edge",
          "data-from": s.node, "data-to": b.node,
        });
        line.append(svg("title", {}, `${s.phrase} → ${b.phrase}: ${fmt(b.mass)}`));
        edges.append(line);
      }
    }
    for (const b of mid) {
      const line = svg("path", { d: curve(xs[1] + box / 2, midY.get(b.node), xs[2] - box / 2,
                                          passageY),
                                 "stroke-width": width(b.mass), stroke: "#6b7785", class: "edge" });
      line.append(svg("title", {}, `${b.phrase} → ${h.title}: ${fmt(b.mass)}`));
      edges.append(line);
    }
    root.append(edges);
    seeds.forEach((s) => root.append(node(s.phrase, s.node, xs[0], seedY.get(s.node),
                                          seedColour(s.phrase), "seed", box, chars)));
    mid.forEach((b) => root.append(node(b.phrase, b.node, xs[1], midY.get(b.node), "#6b7785",
                                        "bridge", box, chars)));
    const p = svg("g", { class: "node passage", transform: `translate(${xs[2]} ${passageY})` });
    p.append(svg("rect", { x: -box / 2, y: -16, width: box, height: 32, rx: 6 }));
    p.append(svg("text", { x: 0, y: 5, "text-anchor": "middle" }, short(h.title, chars)));
    p.append(svg("title", {}, h.title));
    root.append(p);
    if (!seeds.length) {
      root.append(svg("text", { x: W / 2, y: passageY - 26, "text-anchor": "middle", class: "note" },
                      "no seed reaches this passage: its score is its dense term"));
    }
  }

  function curve(x0, y0, x1, y1) {
    const mx = (x0 + x1) / 2;
    return `M ${x0} ${y0} C ${mx} ${y0}, ${mx} ${y1}, ${x1} ${y1}`;
  }

  function crossings(links, rankOf) {
    // pairs of seed -> phrase lines that cross: their ends are in opposite orders
    let n = 0;
    for (let i = 0; i < links.length; i++) {
      for (let j = i + 1; j < links.length; j++) {
        const [a, b] = [links[i], links[j]];
        if ((a[0] - b[0]) * (rankOf.get(a[1]) - rankOf.get(b[1])) < 0) n++;
      }
    }
    return n;
  }

  function orderToUncross(seeds, mid, keep) {
    // The middle column, reordered in place so that seed -> phrase lines cross as little as
    // this finds: each phrase at the mass-weighted mean row of its seeds (the barycentre
    // heuristic), then neighbours swapped while a swap removes crossings. The seeds keep
    // their order (by term); every phrase -> passage line ends at one point and crosses none.
    const links = [];  // [seed row, phrase node]
    const pull = new Map(mid.map((b) => [b.node, [0, 0]]));
    seeds.forEach((s, i) => {
      for (const b of s.bridges) {
        if (!keep.has(b.node)) continue;
        links.push([i, b.node]);
        const p = pull.get(b.node);
        p[0] += i * b.mass; p[1] += b.mass;
      }
    });
    const centre = (b) => { const [w, m] = pull.get(b.node); return m > 0 ? w / m : 0; };
    mid.sort((a, b) => centre(a) - centre(b) || b.mass - a.mass);
    const rankOf = new Map(mid.map((b, i) => [b.node, i]));
    let best = crossings(links, rankOf);
    for (let swapped = true; swapped && best > 0;) {
      swapped = false;
      for (let i = 0; i + 1 < mid.length; i++) {
        [mid[i], mid[i + 1]] = [mid[i + 1], mid[i]];
        rankOf.set(mid[i].node, i); rankOf.set(mid[i + 1].node, i + 1);
        const n = crossings(links, rankOf);
        if (n < best) { best = n; swapped = true; continue; }
        [mid[i], mid[i + 1]] = [mid[i + 1], mid[i]];
        rankOf.set(mid[i].node, i); rankOf.set(mid[i + 1].node, i + 1);
      }
    }
  }

  function node(label, id, x, y, colour, kind, box, chars) {
    const g = svg("g", { class: `node phrase ${kind}`, transform: `translate(${x} ${y})`,
                         tabindex: 0, role: "button", "data-node": id, "data-phrase": label,
                         "aria-label": `${kind} phrase ${label}: show its passages and synonyms` });
    const rect = svg("rect", { x: -box / 2, y: -15, width: box, height: 30, rx: 15 });
    rect.setAttribute("stroke", colour);
    g.append(rect, svg("text", { x: 0, y: 5, "text-anchor": "middle" }, short(label, chars)),
             svg("title", {}, label));
    g.addEventListener("click", () => showPhrase(id));
    g.addEventListener("keydown", (e) => {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); showPhrase(id); }
    });
    return g;
  }

  function showPhrase(id) {
    const data = state.data;
    const info = data && data.phrases.find((p) => p.node === Number(id));
    const body = $("phrase-body");
    if (!info) {
      body.replaceChildren(el("p", { class: "muted", text: "Nothing known about this phrase." }));
      return;
    }
    const hitKeys = new Set(data.hits.map((h) => h.key));
    const passages = el("ul", { class: "phrase-passages" });
    for (const p of info.passages) {
      passages.append(el("li", { dataset: { key: p.key }, class: hitKeys.has(p.key) ? "in-hits" : "" },
        p.title, hitKeys.has(p.key) ? el("span", { class: "muted", text: " (a hit)" }) : ""));
    }
    const synonyms = el("ul", { class: "phrase-synonyms" });
    for (const s of info.synonyms) {
      synonyms.append(el("li", { dataset: { phrase: s.phrase } }, s.phrase,
                         el("span", { class: "muted", text: ` cosine ${fmt(s.score)}` })));
    }
    if (!info.synonyms.length) synonyms.append(el("li", { class: "muted", text: "none" }));
    const more = info.num_passages > info.passages.length
      ? ` (the first ${info.passages.length})` : "";
    body.replaceChildren(
      el("p", { class: "phrase-name", dataset: { node: String(info.node) }, text: info.phrase }),
      el("h3", { text: `Mentioned in ${info.num_passages} passage${info.num_passages === 1 ? "" : "s"}${more}` }),
      passages, el("h3", { text: "Synonyms" }), synonyms);
  }

  // ------------------------------------------------------------------ start

  function start() {
    const match = location.hash.match(/(?:^#|&)token=([^&]+)/);
    if (match) {  // a fragment never reaches a server; drop it from the address bar too
      sessionStorage.setItem(STORE, decodeURIComponent(match[1]));
      history.replaceState(null, "", location.pathname + location.search);
    }
    state.token = sessionStorage.getItem(STORE) || "";
    $("token").value = state.token;
    $("auth-form").addEventListener("submit", (e) => {
      e.preventDefault();
      state.token = $("token").value.trim();
      if (state.token) sessionStorage.setItem(STORE, state.token);
      else sessionStorage.removeItem(STORE);
      connect();
    });
    $("search-form").addEventListener("submit", run);
    loadContract().then(connect);
  }

  document.addEventListener("DOMContentLoaded", start);
})();
