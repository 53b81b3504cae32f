// The rollout page's script (atropos.view). Every piece of data reaches the DOM through
// textContent or createTextNode, never parsed as HTML; images only as data:image/* URLs.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("atropos-data").textContent);
  var groups = data.groups;
  var byId = function (id) { return document.getElementById(id); };
  var state = { q: "", smin: null, smax: null, env: "", finish: "", ovr: false, sort: "order" };
  var nodes = [];      // nodes[i]: the <details> of groups[i]
  var visible = [];    // indexes of shown groups, in shown order
  var current = -1;    // position in `visible` of the keyboard's group

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }
  function fmt(x) {
    if (x === null || x === undefined) { return "n/a"; }
    var r = Math.round(x * 1000) / 1000;
    return String(r);
  }
  function scoreClass(x) {
    if (x === null || x === undefined) { return "na"; }
    return x > 0 ? "pos" : (x < 0 ? "neg" : "zero");
  }
  function chip(label, x) {
    return el("span", "score " + scoreClass(x), label + fmt(x));
  }
  function envKey(g) { return g.env === null || g.env === undefined ? "none" : String(g.env); }
  function hasOverrides(g) {
    if (g.group_overrides) { return true; }
    for (var i = 0; i < g.seqs.length; i++) { if (g.seqs[i].overrides) { return true; } }
    return false;
  }
  function safeImage(url) {
    return typeof url === "string" && /^data:image\/(png|jpeg|jpg|gif|webp|bmp);base64,/.test(url);
  }
  function addImages(parent, urls) {
    (urls || []).forEach(function (u) {
      if (!safeImage(u)) { return; }
      var img = el("img", "im");
      img.alt = "image";
      img.src = u;
      parent.appendChild(img);
    });
  }

  // ---- search text -------------------------------------------------------------------
  function haystack(g) {
    if (g._hay === undefined) {
      var parts = [g.where || "", g.group_id || ""];
      g.seqs.forEach(function (s) {
        (s.messages || []).forEach(function (m) { parts.push(m.role, m.content); });
        if (s.pieces) { parts.push(s.pieces.join("")); }
        if (s.finish) { parts.push(s.finish); }
      });
      g._hay = parts.join("\n").toLowerCase();
    }
    return g._hay;
  }

  // ---- text with search marks and fenced code blocks ---------------------------------
  function appendMarked(parent, text) {
    var q = state.q;
    if (!q) { parent.appendChild(document.createTextNode(text)); return; }
    var low = text.toLowerCase();
    var at = 0;
    var i = low.indexOf(q);
    while (i >= 0) {
      if (i > at) { parent.appendChild(document.createTextNode(text.slice(at, i))); }
      parent.appendChild(el("mark", null, text.slice(i, i + q.length)));
      at = i + q.length;
      i = low.indexOf(q, at);
    }
    if (at < text.length) { parent.appendChild(document.createTextNode(text.slice(at))); }
  }
  var FENCE = /```([^\n`]*)\n([\s\S]*?)(?:\n?```|$)/g;
  function renderText(parent, text) {
    var at = 0;
    var m;
    FENCE.lastIndex = 0;
    while ((m = FENCE.exec(text)) !== null) {
      if (m.index > at) {
        var plain = el("div", "text");
        appendMarked(plain, text.slice(at, m.index));
        parent.appendChild(plain);
      }
      var pre = el("pre", "code");
      if (m[1].trim()) { pre.appendChild(el("span", "lang", m[1].trim())); }
      var code = el("code");
      appendMarked(code, m[2]);
      pre.appendChild(code);
      parent.appendChild(pre);
      at = FENCE.lastIndex;
      if (m[0].length === 0) { FENCE.lastIndex++; }
    }
    if (at < text.length || text.length === 0) {
      var rest = el("div", "text");
      appendMarked(rest, text.slice(at));
      parent.appendChild(rest);
    }
  }

  // ---- one group's body ----------------------------------------------------------------
  function roleClass(role) {
    var r = String(role || "").toLowerCase();
    return /^[a-z_]+$/.test(r) ? " role-" + r : "";
  }
  function tokenView(s) {
    var box = el("div", "toks");
    var trained = [];
    if (s.runs) {
      s.runs.forEach(function (n, k) { for (var j = 0; j < n; j++) { trained.push(k % 2 === 1); } });
    }
    s.pieces.forEach(function (p, i) {
      var kind = s.runs ? (trained[i] ? "t" : "m") : "u";
      var span = el("span", kind + (i % 2 ? " odd" : ""), p);
      span.title = "token " + i + (s.runs ? (trained[i] ? ": trained" : ": masked") : "");
      box.appendChild(span);
    });
    return box;
  }
  function messageNode(m) {
    var msg = el("div", "msg" + roleClass(m.role));
    msg.appendChild(el("div", "role", m.role || "(no role)"));
    renderText(msg, m.content);
    addImages(msg, m.images);
    if (m.extra) { msg.appendChild(el("pre", "extra", m.extra)); }
    return msg;
  }
  // sequence i; its first `skip` messages are the group's shared prompt, shown once above
  function sequenceNode(s, i, skip, best) {
    var box = el("div", "seq");
    var head = el("div", "seqhead");
    head.appendChild(el("strong", null, "sequence " + (i + 1)));
    head.appendChild(chip("score ", s.score));
    if (best) { head.appendChild(el("span", "best", "best")); }
    if (s.n !== null) {
      head.appendChild(el("span", "dim", s.n + " tokens" +
        (s.trained !== null ? ", " + s.trained + " trained" : "")));
    }
    if (s.finish) { head.appendChild(el("span", "dim", "finish: " + s.finish)); }
    if (s.lp !== null && s.lp !== undefined) {
      head.appendChild(el("span", "dim", "mean logprob (trained): " + fmt(s.lp)));
    }
    box.appendChild(head);
    if (s.overrides) {
      var rest = {};
      Object.keys(s.overrides).forEach(function (k) { if (k !== "finish_reason") { rest[k] = s.overrides[k]; } });
      if (Object.keys(rest).length) { box.appendChild(el("pre", "extra", "overrides: " + JSON.stringify(rest))); }
    }
    (s.messages || []).slice(skip).forEach(function (m) { box.appendChild(messageNode(m)); });
    if (!s.messages && !s.pieces) {
      box.appendChild(el("div", "dim", "no messages recorded" +
        (data.tokenizer ? "" : "; pass --tokenizer to see the tokens")));
    }
    if (s.pieces_error) { box.appendChild(el("div", "dim", "tokens not decoded: " + s.pieces_error)); }
    if (s.pieces) {
      var tok = el("details", "tokens");
      var sum = el("summary", null, "tokens (" + s.pieces.length + (s.trained !== null ?
        ", " + s.trained + " trained" : "") + ")");
      tok.appendChild(sum);
      var built = false;
      var build = function () {
        if (built || !tok.open) { return; }
        built = true;
        var legend = el("div", "legend");
        legend.appendChild(el("span", "t", "trained"));
        legend.appendChild(el("span", "m", "masked (not trained)"));
        tok.appendChild(legend);
        tok.appendChild(tokenView(s));
      };
      tok.addEventListener("toggle", build);
      if (!s.messages) { tok.open = true; }
      box.appendChild(tok);
      build();
    }
    return box;
  }
  function buildBody(node, g) {
    var old = node.querySelector(".body");
    if (old) { old.remove(); }
    var body = el("div", "body");
    var meta = el("div", "meta");
    if (g.group_id) { meta.appendChild(el("span", null, "group_id " + g.group_id)); }
    if (g.policy_version !== null) { meta.appendChild(el("span", null, "policy_version " + g.policy_version)); }
    if (g.token_source) { meta.appendChild(el("span", null, "token_source " + g.token_source)); }
    if (g.received) { meta.appendChild(el("span", null, "received " + new Date(g.received * 1000).toISOString())); }
    if (meta.childNodes.length) { body.appendChild(meta); }
    if (g.group_overrides) { body.appendChild(el("pre", "extra", "group_overrides: " + JSON.stringify(g.group_overrides))); }
    addImages(body, g.images);
    var k = g.shared || 0;
    if (k > 0) {
      var shared = el("div", "shared");
      shared.appendChild(el("div", "sharedhead", "prompt, shared by all " + g.seqs.length +
        " sequences (" + k + (k === 1 ? " message" : " messages") + "); each sequence below shows its own part"));
      g.seqs[0].messages.slice(0, k).forEach(function (m) { shared.appendChild(messageNode(m)); });
      body.appendChild(shared);
    }
    g.seqs.forEach(function (s, i) { body.appendChild(sequenceNode(s, i, k, i === g.best)); });
    node.appendChild(body);
    node._q = state.q;
  }
  function groupNode(g, idx) {
    var d = el("details", "group");
    d.dataset.idx = String(idx);
    var s = el("summary");
    s.appendChild(el("span", "gi", "#" + (idx + 1)));
    var st = g.stats;
    s.appendChild(chip("mean ", st ? st.mean : null));
    if (st) {
      s.appendChild(el("span", "dim", "min " + fmt(st.min) + " · max " + fmt(st.max) +
        " · spread " + fmt(st.spread)));
    }
    s.appendChild(el("span", null, g.seqs.length + (g.seqs.length === 1 ? " sequence" : " sequences")));
    var scores = el("span", "scores");
    g.seqs.forEach(function (q) { scores.appendChild(el("span", "score " + scoreClass(q.score), fmt(q.score))); });
    s.appendChild(scores);
    if (g.env !== null) { s.appendChild(el("span", "dim", "env " + g.env)); }
    s.appendChild(el("span", "where", g.where));
    if (g.prompt_preview || g.answer_preview) {
      var pv = el("span", "previews");
      var line = function (label, text) {
        var row = el("span", "pv");
        row.appendChild(el("span", "pvlabel", label));
        row.appendChild(el("span", "pvtext", text === null ? "(none)" : text));
        pv.appendChild(row);
      };
      line("prompt", g.prompt_preview);
      line(g.best !== null ? "best answer (" + fmt(g.seqs[g.best].score) + ")" : "answer", g.answer_preview);
      s.appendChild(pv);
    }
    d.appendChild(s);
    d.addEventListener("toggle", function () {
      if (d.open && d._q !== state.q) { buildBody(d, g); }
    });
    return d;
  }

  // ---- filter and sort -----------------------------------------------------------------
  function passes(g) {
    if (state.q && haystack(g).indexOf(state.q) < 0) { return false; }
    var mean = g.stats ? g.stats.mean : null;
    if (state.smin !== null && (mean === null || mean < state.smin)) { return false; }
    if (state.smax !== null && (mean === null || mean > state.smax)) { return false; }
    if (state.env !== "" && envKey(g) !== state.env) { return false; }
    if (state.finish !== "" && !g.seqs.some(function (s) { return s.finish === state.finish; })) {
      return false;
    }
    if (state.ovr && !hasOverrides(g)) { return false; }
    return true;
  }
  var SORTS = {
    "mean-desc": function (g) { return g.stats ? -g.stats.mean : null; },
    "mean-asc": function (g) { return g.stats ? g.stats.mean : null; },
    "max-desc": function (g) { return g.stats ? -g.stats.max : null; },
    "spread-desc": function (g) { return g.stats ? -g.stats.spread : null; }
  };
  function order() {
    var idx = groups.map(function (_, i) { return i; });
    var key = SORTS[state.sort];
    if (!key) { return idx; }
    return idx.sort(function (a, b) {
      var ka = key(groups[a]);
      var kb = key(groups[b]);
      if (ka === null || kb === null) {
        if (ka !== kb) { return ka === null ? 1 : -1; }
      } else if (ka !== kb) { return ka - kb; }
      return a - b;
    });
  }
  var lastSort = null;
  function apply() {
    var main = byId("groups");
    var sorted = order();
    if (lastSort !== state.sort) {
      var frag = document.createDocumentFragment();
      sorted.forEach(function (i) { frag.appendChild(nodes[i]); });
      main.appendChild(frag);
      lastSort = state.sort;
    }
    visible = [];
    sorted.forEach(function (i) {
      var ok = passes(groups[i]);
      nodes[i].hidden = !ok;
      if (ok) {
        visible.push(i);
        if (nodes[i].open && nodes[i]._q !== state.q) { buildBody(nodes[i], groups[i]); }
      }
    });
    var seqs = 0;
    visible.forEach(function (i) { seqs += groups[i].seqs.length; });
    byId("count").textContent = "showing " + visible.length + " of " + groups.length +
      " groups (" + seqs + " sequences)";
    document.body.dataset.shown = String(visible.length);
    current = -1;
  }
  function numberOrNull(v) {
    if (v === "" || v === null) { return null; }
    var x = Number(v);
    return isFinite(x) ? x : null;
  }
  function readControls() {
    state.q = byId("q").value.trim().toLowerCase();
    state.smin = numberOrNull(byId("smin").value);
    state.smax = numberOrNull(byId("smax").value);
    state.env = byId("env").value;
    state.finish = byId("finish").value;
    state.ovr = byId("ovr").checked;
    state.sort = byId("sort").value;
    apply();
  }

  // ---- header: overview, banners, control options ------------------------------------
  function header() {
    var parts = [groups.length + (groups.length === 1 ? " group" : " groups")];
    var names = data.sources.map(function (s) { return s.name + " (" + s.groups + ")"; });
    if (names.length) { parts.push("from " + names.join(", ")); }
    parts.push(data.tokenizer ? "tokenizer " + data.tokenizer : "no tokenizer");
    byId("overview").textContent = parts.join(" · ");
    var banners = byId("banners");
    if (data.bad) {
      var b = el("div", "banner bad");
      b.id = "bad-lines";
      b.appendChild(el("strong", null, data.bad + (data.bad === 1 ? " line was" : " lines were") +
        " skipped (not JSON, or not a group)"));
      var ul = el("ul");
      data.bad_examples.forEach(function (x) {
        ul.appendChild(el("li", null, x.source + (x.line ? ":" + x.line : "") + ": " + x.reason));
      });
      if (data.bad > data.bad_examples.length) {
        ul.appendChild(el("li", null, "and " + (data.bad - data.bad_examples.length) + " more"));
      }
      b.appendChild(ul);
      banners.appendChild(b);
    }
    data.notes.forEach(function (n) { banners.appendChild(el("div", "banner note", n)); });
    var envs = {};
    var finishes = {};
    var anyOverrides = false;
    groups.forEach(function (g) {
      envs[envKey(g)] = true;
      g.seqs.forEach(function (s) { if (s.finish) { finishes[s.finish] = true; } });
      if (hasOverrides(g)) { anyOverrides = true; }
    });
    Object.keys(envs).sort().forEach(function (k) {
      var o = el("option", null, k === "none" ? "none" : "env " + k);
      o.value = k;
      byId("env").appendChild(o);
    });
    var fs = Object.keys(finishes).sort();
    fs.forEach(function (k) {
      var o = el("option", null, k);
      o.value = k;
      byId("finish").appendChild(o);
    });
    byId("finish-label").hidden = fs.length === 0;
    byId("ovr-label").hidden = !anyOverrides;
  }

  // ---- keyboard ------------------------------------------------------------------------
  function focusGroup(pos) {
    if (!visible.length) { return; }
    pos = Math.max(0, Math.min(visible.length - 1, pos));
    if (current >= 0 && current < visible.length) { nodes[visible[current]].classList.remove("current"); }
    current = pos;
    var node = nodes[visible[current]];
    node.classList.add("current");
    node.querySelector("summary").focus();
    node.scrollIntoView({ block: "nearest" });
  }
  document.addEventListener("keydown", function (e) {
    var tag = (e.target && e.target.tagName) || "";
    if (tag === "INPUT" || tag === "SELECT" || tag === "TEXTAREA") {
      if (e.key === "Escape") { e.target.blur(); }
      return;
    }
    if (e.ctrlKey || e.metaKey || e.altKey) { return; }
    if (e.key === "/") { e.preventDefault(); byId("q").focus(); }
    else if (e.key === "j") { focusGroup(current + 1); }
    else if (e.key === "k") { focusGroup(current < 0 ? 0 : current - 1); }
    else if (e.key === "o" && current >= 0) {
      var node = nodes[visible[current]];
      node.open = !node.open;
    }
  });

  // ---- start -------------------------------------------------------------------------
  header();
  var main = byId("groups");
  main.textContent = "";
  groups.forEach(function (g, i) { nodes.push(groupNode(g, i)); });
  var timer = null;
  byId("q").addEventListener("input", function () {
    clearTimeout(timer);
    timer = setTimeout(readControls, 120);
  });
  ["smin", "smax"].forEach(function (id) { byId(id).addEventListener("input", readControls); });
  ["env", "finish", "ovr", "sort"].forEach(function (id) {
    byId(id).addEventListener("change", readControls);
  });
  readControls();
  document.body.dataset.ready = "1";
})();
