// halyard view: every page is built here from the JSON API. Text from runs (model
// answers, judge outputs, prompts) only ever goes into the page through textContent,
// with control characters made visible: it is shown, never parsed or run.
"use strict";

// Control characters (terminal escapes, NUL, ...) as their visible Control Pictures.
function vis(s) {
  if (s === null || s === undefined) return "";
  return String(s).replace(/[\u0000-\u0008\u000b-\u001f\u007f]/g, (c) =>
    c === "\u007f" ? "\u2421" : String.fromCharCode(0x2400 + c.charCodeAt(0)));
}

// el("tag", {class: "x", "data-k": "v"}, child, "text", ...): children are nodes or text.
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "onclick") e.addEventListener("click", v);
    else if (k === "onchange") e.addEventListener("change", v);
    else e.setAttribute(k, String(v));
  }
  for (const k of kids) {
    if (k === null || k === undefined) continue;
    e.appendChild(typeof k === "object" ? k : document.createTextNode(vis(k)));
  }
  return e;
}

function pre(text, cls) { return el("pre", { class: "text " + (cls || "") }, text); }

async function api(path) {
  const r = await fetch(path, { headers: { accept: "application/json" } });
  const body = await r.json().catch(() => ({ error: "not JSON (HTTP " + r.status + ")" }));
  if (!r.ok) throw new Error(body.error || ("HTTP " + r.status));
  return body;
}

function num(x, digits) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  return typeof x === "number" ? x.toFixed(digits === undefined ? 4 : digits) : String(x);
}

function duration(s) {
  if (s === null || s === undefined) return "–";
  s = Math.round(s);
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
  return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
}

function money(x) { return x === null || x === undefined ? "–" : "$" + x.toFixed(4); }

const main = () => document.getElementById("main");
const params = () => new URLSearchParams(location.search);

function setParams(p) {
  const q = p.toString();
  history.replaceState(null, "", location.pathname + (q ? "?" + q : ""));
}

function fail(where, e) {
  const m = main();
  m.appendChild(el("p", { class: "error", id: "error" }, where + ": " + e.message));
  document.body.dataset.ready = "error";
}

// ---- progress cells, shared by the runs page and a run's page ----
function progressCells(r) {
  const done = r.items_done, total = r.items_total;
  const share = total ? Math.min(1, done / total) : (r.has_report ? 1 : 0);
  // Set through the CSSOM: the page's policy refuses style attributes.
  const fill = el("span", {});
  fill.style.width = (share * 100).toFixed(1) + "%";
  const bar = el("span", { class: "bar" }, fill);
  const text = total !== null && total !== undefined ? done + " / " + total : (r.has_report ? "done" : "–");
  return {
    progress: el("td", { class: "progress", "data-done": done === null ? "" : done }, bar, text),
    rate: el("td", { class: "rate" }, r.rate_items_per_s ? num(r.rate_items_per_s, 2) + " items/s" : "–"),
    cost: el("td", { class: "cost" }, money(r.spent)),
    eta: el("td", { class: "eta" }, r.live ? duration(r.eta_s) : "–"),
  };
}

function headlineText(r) {
  return r.headline.map((h) => "b" + h.benchmark + " " + h.pipeline + " · " + h.model +
    (h.judge ? " (judge " + h.judge + ")" : "") + ": " + h.figure + " " + num(h.value)).join("\n");
}

// ---- Runs ----
async function runsPage() {
  const m = main();
  m.replaceChildren(el("h1", {}, "Runs"),
    el("p", { class: "muted" }, "Live runs refresh every second from what their coordinator publishes (status.json)."));
  const tbody = el("tbody", { id: "runs" });
  m.appendChild(el("table", {},
    el("thead", {}, el("tr", {}, ...["", "run", "state", "progress", "rate", "cost", "ETA", "dead letters", "headline figures"].map((h) => el("th", {}, h)))),
    tbody));
  const go = el("button", { id: "compare-go", onclick: () => {
    const keys = [...document.querySelectorAll("input.pick:checked")].map((c) => c.value);
    location.href = "/compare?runs=" + encodeURIComponent(keys.join(","));
  } }, "Compare the runs ticked (one run: its models)");
  m.appendChild(go);
  const picked = new Set();
  let refreshes = 0;
  async function refresh() {
    let list;
    try { list = await api("/api/runs"); } catch (e) { fail("runs", e); return; }
    document.querySelectorAll("input.pick:checked").forEach((c) => picked.add(c.value));
    document.querySelectorAll("input.pick:not(:checked)").forEach((c) => picked.delete(c.value));
    tbody.replaceChildren(...list.map((r) => {
      const c = progressCells(r);
      const pick = el("input", { type: "checkbox", class: "pick", value: r.key });
      if (!r.has_report) pick.disabled = true;
      if (picked.has(r.key)) pick.checked = true;
      return el("tr", { "data-run": r.key, "data-state": r.state },
        el("td", {}, pick),
        // A run known only from the broker (another machine's) has no page here.
        el("td", {}, r.dir ? el("a", { href: "/run/" + encodeURIComponent(r.key) }, r.name) : r.name + " (broker)"),
        el("td", { class: "state state-" + r.state }, r.state),
        c.progress, c.rate, c.cost, c.eta,
        el("td", {}, r.dead_letters === null ? "–" : String(r.dead_letters)),
        el("td", {}, pre(headlineText(r) + (r.problems.length ? "\n" + r.problems.join("\n") : ""))));
    }));
    refreshes += 1;
    document.body.dataset.refreshes = String(refreshes);
    document.body.dataset.ready = "runs";
  }
  await refresh();
  setInterval(refresh, 1000);
}

// ---- A run ----
async function runPage(key) {
  const m = main();
  let info;
  try { info = await api("/api/run/" + encodeURIComponent(key)); } catch (e) { fail("run " + key, e); return; }
  const r = info.run;
  const summary = el("table", { id: "summary" });
  function drawSummary(r) {
    const c = progressCells(r);
    summary.replaceChildren(
      el("tr", {}, ...["state", "progress", "rate", "cost", "ETA", "dead letters"].map((h) => el("th", {}, h))),
      el("tr", {}, el("td", { class: "state state-" + r.state }, r.state), c.progress, c.rate, c.cost, c.eta,
        el("td", {}, r.dead_letters === null ? "–" : String(r.dead_letters))));
  }
  drawSummary(r);
  m.replaceChildren(el("h1", {}, "Run " + r.name), el("p", { class: "muted" }, r.dir), summary);
  if (r.live) {
    m.appendChild(el("p", { id: "live-note" }, "This run is live: its store belongs to its coordinator, so its items are browsable once it finishes (the coordinator writes labels.jsonl with the report). Progress, rate, cost and ETA refresh every second from its status."));
    setInterval(async () => {
      try {
        const list = await api("/api/runs");
        const now = list.find((x) => x.key === key);
        if (now) drawSummary(now);
        if (now && now.has_report && !now.live) location.reload();
      } catch (e) { /* the next tick tries again */ }
    }, 1000);
  }
  if (r.has_report) {
    m.appendChild(el("h2", {}, "Report"));
    m.appendChild(el("iframe", { id: "report", src: "/run/" + encodeURIComponent(key) + "/report.html", title: "report.html" }));
    m.appendChild(el("p", {}, el("a", { href: "/compare?runs=" + encodeURIComponent(key) }, "Compare this run's models (paired tests, power)")));
  }
  if (info.facets) itemBrowser(m, key, info.facets);
  document.body.dataset.ready = info.facets ? "run-pending-items" : "run";
}

function itemBrowser(m, key, f) {
  const p = params();
  m.appendChild(el("h2", {}, "Items (" + f.rows + " rows of labels.jsonl)"));
  const sel = (name, options) => {
    const s = el("select", { name: name, id: "filter-" + name },
      el("option", { value: "" }, "any"),
      ...options.map(([v, t]) => el("option", { value: v }, t)));
    s.value = p.get(name) || "";
    s.addEventListener("change", () => { offset = 0; load(); });
    return el("label", {}, name + " ", s);
  };
  const filters = el("div", { class: "filters" },
    sel("benchmark", f.benchmarks.map(([b, pl, n]) => [String(b), b + " " + pl + " (" + n + ")"])),
    sel("model", f.models.map(([x, n]) => [x, x + " (" + n + ")"])),
    sel("label", f.labels.map(([x, n]) => [x, x + " (" + n + ")"])),
    sel("flag", f.flags.map(([x, n]) => [x, x.replace(/_/g, " ") + " (" + n + ")"])));
  const itemFilter = p.get("item");
  const pager = el("div", { id: "pager" });
  const tbody = el("tbody", { id: "items" });
  const detail = el("div", { id: "item" });
  m.append(filters, pager,
    el("table", {}, el("thead", {}, el("tr", {}, ...["#", "bench", "item", "model", "judge", "label", "flags", "prompt", "answer"].map((h) => el("th", {}, h)))), tbody),
    detail);
  let offset = Number(p.get("offset") || 0);
  const limit = 25;
  async function load() {
    const q = new URLSearchParams();
    for (const n of ["benchmark", "model", "label", "flag"]) {
      const v = document.getElementById("filter-" + n).value;
      if (v) q.set(n, v);
    }
    if (itemFilter) q.set("item", itemFilter);
    const shown = new URLSearchParams(q);
    if (offset) shown.set("offset", offset);
    setParams(shown);
    q.set("offset", offset);
    q.set("limit", limit);
    let page;
    try { page = await api("/api/run/" + encodeURIComponent(key) + "/items?" + q); } catch (e) { fail("items", e); return; }
    tbody.replaceChildren(...page.rows.map((row) => el("tr", { class: "clickable", "data-row": row.row, onclick: () => showItem(key, row.row, detail) },
      el("td", {}, String(row.row + 1)), el("td", {}, String(row.benchmark)), el("td", {}, row.item),
      el("td", {}, row.model), el("td", {}, row.judge), el("td", { class: "label" }, row.label),
      el("td", {}, ...row.flags.map((x) => el("span", { class: "flag" }, x.replace(/_/g, " ")))),
      el("td", {}, row.prompt), el("td", { class: "answer" }, row.answer))));
    const last = Math.min(page.total, page.offset + page.rows.length);
    pager.replaceChildren(
      el("button", { id: "prev", onclick: () => { offset = Math.max(0, offset - limit); load(); } }, "◀ previous"),
      el("span", { id: "page-info", "data-total": page.total }, " rows " + (page.total ? page.offset + 1 : 0) + "–" + last + " of " + page.total + " "),
      el("button", { id: "next", onclick: () => { if (offset + limit < page.total) { offset += limit; load(); } } }, "next ▶"));
    document.getElementById("prev").disabled = offset === 0;
    document.getElementById("next").disabled = offset + limit >= page.total;
    document.body.dataset.ready = "run";
    document.body.dataset.loads = String(Number(document.body.dataset.loads || 0) + 1);
    if (itemFilter && page.rows.length && !detail.dataset.row) showItem(key, page.rows[0].row, detail);
  }
  load();
}

// One judge check (HypoTermQA's acceptance / meaning): each call's raw output and the
// verdict parsed from it.
function judgeCheck(name, c) {
  if (!c) return null;
  return el("div", { class: "judge", "data-check": name },
    el("div", {}, el("b", {}, name), " parsed verdict: ", el("span", { class: "parsed" }, c.parsed === null ? "(unusable)" : c.parsed),
      " · row label: ", String(c.label)),
    ...c.attempts.map((a, i) => el("div", { class: "attempt" },
      el("div", { class: "muted" }, "call " + (i + 1) + " · job ", el("code", { class: "job" }, a.job_id),
        a.error ? " · error: " + a.error : "", a.odd ? " · " + a.odd : ""),
      pre(a.output === null ? "(no output: the job failed)" : a.output, "judge-output"))),
    c.reasoning ? el("div", {}, "reasoning: ", pre(c.reasoning)) : null);
}

function rowView(r, panelOf) {
  const v = r.value;
  const verdict = panelOf(r.model);
  const kids = [
    el("h3", {}, "Model " + r.model + " · judge " + r.judge + " · label ", el("span", { class: "label" }, r.label),
      verdict === undefined ? null : " · panel verdict ",
      verdict === undefined ? null : el("span", { class: "row-panel" }, verdict === null ? "none (tie or no judge)" : verdict),
      " ", ...r.flags.map((x) => el("span", { class: "flag" }, x.replace(/_/g, " ")))),
    el("div", { class: "muted" }, "labels.jsonl line " + r.line + (v.answer_job ? " · answer job " : ""), v.answer_job ? el("code", { class: "job" }, v.answer_job) : null),
  ];
  if ("answer" in v) kids.push(el("div", {}, "answer" + (v.answer_kind ? " (" + v.answer_kind + ")" : "") + ":"), pre(v.answer === null ? "(no answer)" : v.answer, "model-answer"));
  if (v.answer_error) kids.push(el("div", { class: "error" }, "answer job failed: " + v.answer_error));
  for (const t of (v.terms || [])) {
    kids.push(el("div", { class: "term" }, el("b", {}, "term " + t.term), " (" + (t.is_hypothetical ? "hypothetical" : "valid") + ", " + t.term_set + ") included: " + t.included + " · term label: " + (t.term_label || "–")));
    kids.push(judgeCheck("acceptance", t.acceptance));
    kids.push(judgeCheck("meaning", t.meaning));
  }
  kids.push(el("details", {}, el("summary", {}, "the whole row (JSON)"), pre(JSON.stringify(v, null, 2))));
  return el("div", { class: "panel row-view", "data-row": r.row }, ...kids);
}

async function showItem(key, row, detail) {
  document.querySelectorAll("tr.selected").forEach((t) => t.classList.remove("selected"));
  const tr = document.querySelector('tr[data-row="' + row + '"]');
  if (tr) tr.classList.add("selected");
  let it;
  try { it = await api("/api/run/" + encodeURIComponent(key) + "/item/" + row); } catch (e) { fail("item", e); return; }
  const first = it.rows[0] ? it.rows[0].value : {};
  const prompt = first.question || first.prompt || first.claim || first.input || first.text || "";
  const kids = [el("h2", {}, "Item " + it.item + " of benchmark " + it.benchmark + " (" + it.pipeline + ")"),
    el("div", {}, "prompt:"), pre(prompt, "prompt")];
  // The panel's verdict on a model's whole answer (a unit without a part).
  const panelOf = (model) => {
    const u = it.panel.find((p) => p.model === model && (p.part === undefined || p.part === null));
    return u === undefined ? undefined : u.verdict;
  };
  kids.push(...it.rows.map((r) => rowView(r, panelOf)));
  const judges = it.panel.length ? it.panel[0].votes.map((v) => v.judge) : [];
  kids.push(el("h3", {}, "Panel verdict"), it.panel.length
    ? el("table", { id: "panel" },
      el("tr", {}, el("th", {}, "model"), el("th", {}, "part"), ...judges.map((j) => el("th", {}, j)), el("th", {}, "verdict"), el("th", {}, "rule")),
      ...it.panel.map((p) => el("tr", { "data-model": p.model },
        el("td", {}, p.model), el("td", {}, p.part === undefined || p.part === null ? "–" : String(p.part)),
        ...p.votes.map((v) => el("td", { class: "vote" }, v.label === null ? "none" : v.label)),
        el("td", { class: "panel-verdict" }, p.verdict === null ? "none (tie or no judge)" : p.verdict),
        el("td", {}, p.rule + (p.ruled ? " (labelled by a rule)" : "")))))
    : el("p", { class: "muted", id: "panel-none" }, it.panel_file
      ? "no unit of this item was judged (no answer, or labelled by a rule before any judge)"
      : "one judge and no human labels: the judge's label is the verdict"));
  kids.push(el("h3", {}, "Human labels"), it.human.length
    ? el("table", { id: "human" }, el("tr", {}, el("th", {}, "model"), el("th", {}, "label"), el("th", {}, "annotator")),
      ...it.human.map((h) => el("tr", {}, el("td", {}, h.model), el("td", {}, h.label), el("td", {}, h.annotator || "–"))))
    : el("p", { class: "muted" }, "none imported for this item"));
  kids.push(el("h3", {}, "Dead letters of these jobs"), it.dead_letters.length
    ? el("table", { id: "dead" }, el("tr", {}, ...["job", "stage", "model", "kind", "error", "deliveries"].map((h) => el("th", {}, h))),
      ...it.dead_letters.map((d) => el("tr", { id: "dead-" + d.job, class: "dead-letter" }, el("td", {}, el("code", {}, d.job)), el("td", {}, d.stage || "?"), el("td", {}, d.model || "?"),
        el("td", {}, d.kind), el("td", {}, d.error), el("td", {}, String(d.deliveries)))))
    : el("p", { class: "muted" }, "none"));
  detail.dataset.row = String(row);
  detail.replaceChildren(el("div", { class: "panel" }, ...kids));
  // A job that became a dead letter links to its row in the table above.
  const dead = new Set(it.dead_letters.map((d) => d.job));
  for (const c of detail.querySelectorAll("code.job")) {
    if (!dead.has(c.textContent)) continue;
    const a = el("a", { class: "dead-link", href: "#dead-" + c.textContent, title: "this job is a dead letter" });
    c.replaceWith(a);
    a.append(c, " (dead letter)");
  }
  document.body.dataset.item = String(row);
}

// ---- Compare ----
async function comparePage() {
  const m = main();
  const p = params();
  const keys = (p.get("runs") || "").split(",").filter((x) => x);
  const target = Number(p.get("target") || 0.05);
  m.replaceChildren(el("h1", {}, "Compare"));
  let list = [];
  try { list = await api("/api/runs"); } catch (e) { fail("runs", e); return; }
  const picks = el("div", { id: "picks" }, ...list.filter((r) => r.has_report).map((r) => {
    const c = el("input", { type: "checkbox", class: "pick", value: r.key });
    c.checked = keys.includes(r.key);
    return el("label", {}, c, r.name + " ");
  }));
  const t = el("input", { type: "number", id: "target", step: "0.01", min: "0.01", max: "0.99", value: target });
  m.append(el("p", {}, "Runs (one run: its models are compared with each other):"), picks,
    el("p", {}, "n needed to detect a difference of ", t, " ",
      el("button", { id: "compare-run", onclick: () => {
        const ks = [...document.querySelectorAll("#picks input:checked")].map((c) => c.value);
        location.href = "/compare?runs=" + encodeURIComponent(ks.join(",")) + "&target=" + encodeURIComponent(t.value);
      } }, "Compare")));
  if (!keys.length) { document.body.dataset.ready = "compare"; return; }
  let c;
  try { c = await api("/api/compare?runs=" + encodeURIComponent(keys.join(",")) + "&target=" + target); } catch (e) { fail("compare", e); return; }
  m.appendChild(el("p", { class: "muted" }, "Paired tests on the items both results share, as halyard report computes them. Power (McNemar rows): Connor (1987), α = 0.05 two-sided, 80% power, assuming the discordance rate observed on the shared items."));
  const disc = el("div", { id: "discordant" });
  const rows = c.rows.map((r, i) => el("tr", { "data-i": i },
    el("td", {}, r.group), el("td", {}, r.figure), el("td", {}, r.a), el("td", {}, r.b), el("td", {}, String(r.shared)),
    el("td", {}, r.difference), el("td", {}, r.interval), el("td", {}, r.test), el("td", { class: "verdict" }, r.verdict),
    el("td", { class: "discordance" }, r.power ? num(r.power.discordance, 3) + " (" + r.only_a + " + " + r.only_b + ")" : "–"),
    el("td", { class: "mdd" }, r.power ? num(r.power.min_detectable, 3) : "–"),
    el("td", { class: "n-needed" }, r.power ? (r.power.n_needed === null ? "none (the discordance rate is below the difference)" : String(r.power.n_needed)) : "–"),
    el("td", {}, r.only_a !== null ? el("button", { class: "show-discordant", onclick: () => showDiscordant(keys, r, disc) }, "discordant items") : "–")));
  m.appendChild(el("table", { id: "comparison" },
    el("thead", {}, el("tr", {}, ...["group", "figure", "A", "B", "shared", "A − B", "95% CI", "test", "result", "discordance rate (A only + B only)", "min. detectable difference", "n needed for " + c.target, ""].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows)));
  for (const w of c.warnings) m.appendChild(el("p", { class: "error" }, w));
  m.appendChild(disc);
  document.body.dataset.ready = "compare";
  document.body.dataset.rows = String(c.rows.length);
}

async function showDiscordant(keys, r, box) {
  const q = new URLSearchParams({ runs: keys.join(","), group: r.group, figure: r.figure, a: r.a, b: r.b });
  let items;
  try { items = await api("/api/compare/discordant?" + q); } catch (e) { fail("discordant", e); return; }
  box.replaceChildren(el("h2", {}, "Discordant items: " + r.a + " vs " + r.b + " (" + items.length + ")"),
    el("table", { id: "discordant-items" }, el("tr", {}, el("th", {}, "item"), el("th", {}, "right"), el("th", {}, "")),
      ...items.map((d) => el("tr", { "data-item": d.item },
        el("td", {}, d.item), el("td", {}, d.a_right ? "A (" + d.model_a + ")" : "B (" + d.model_b + ")"),
        el("td", {}, el("a", { href: "/run/" + encodeURIComponent(d.run_a) + "?item=" + encodeURIComponent(d.item) }, "open in " + d.run_a))))));
  document.body.dataset.discordant = String(items.length);
}

function route() {
  const path = location.pathname;
  if (path === "/" || path === "") return runsPage();
  if (path === "/compare") return comparePage();
  const m = path.match(/^\/run\/([^/]+)$/);
  if (m) return runPage(decodeURIComponent(m[1]));
  main().replaceChildren(el("p", { class: "error" }, "no page " + path));
}

window.addEventListener("error", (e) => { document.body.dataset.errors = (document.body.dataset.errors || "") + e.message + ";"; });
document.addEventListener("DOMContentLoaded", route);
