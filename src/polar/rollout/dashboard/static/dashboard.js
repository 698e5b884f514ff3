// The Polar rollout dashboard's one script: it follows the server's event stream
// (GET /events, Server-Sent Events; the viewer cookie opens it) and, when something happens,
// fetches the page's live part again, rendered by the server, and swaps it in. It also lists
// the latest events. Nothing here writes to the server; nothing is fetched from elsewhere.
"use strict";
(function () {
  const body = document.body;
  const base = body.dataset.base || "";
  const task = body.dataset.task || null;
  const live = document.getElementById("live");
  const list = document.getElementById("events");
  const connection = document.getElementById("connection");
  const updated = document.getElementById("updated");
  const EVENTS_KEPT = 40;
  const POLL_MS = 2000; // heartbeats move the pools without an event
  let timer = null;
  let busy = false;
  let again = false;

  function setConnection(text, kind) {
    connection.textContent = text;
    connection.className = "conn " + kind;
  }

  function soon(delay) {
    if (live && timer === null) timer = setTimeout(refresh, delay === undefined ? 200 : delay);
  }

  async function refresh() {
    timer = null;
    if (busy) { again = true; return; }
    busy = true;
    try {
      const reply = await fetch(live.dataset.src, { credentials: "same-origin", cache: "no-store" });
      if (reply.ok) {
        live.innerHTML = await reply.text(); // autoescaped by the server's templates
        updated.textContent = "updated " + new Date().toLocaleTimeString();
      } else if (reply.status === 401) {
        setConnection("signed out: open the sign-in link again", "bad");
      }
    } catch (error) {
      setConnection("server unreachable", "bad");
    } finally {
      busy = false;
      if (again) { again = false; soon(); }
    }
  }

  function note(kind, data) {
    if (!list) return;
    const placeholder = list.querySelector("li.note");
    if (placeholder) placeholder.remove();
    const item = document.createElement("li");
    const label = document.createElement("span");
    label.className = "kind";
    label.textContent = kind;
    item.appendChild(label);
    const parts = [new Date().toLocaleTimeString()];
    for (const key of ["task_id", "session_id", "node_id", "status", "reward", "state", "error"]) {
      if (data[key] !== undefined && data[key] !== null) parts.push(key + "=" + data[key]);
    }
    item.appendChild(document.createTextNode(parts.join(" ")));
    item.title = JSON.stringify(data);
    list.prepend(item);
    while (list.children.length > EVENTS_KEPT) list.lastChild.remove();
  }

  const url = base + "/events" + (task ? "?task_id=" + encodeURIComponent(task) : "");
  const source = new EventSource(url); // reconnects by itself, resuming with Last-Event-ID
  source.onopen = function () { setConnection("live", "ok"); };
  source.onerror = function () { setConnection("reconnecting…", "warn"); };
  for (const kind of (body.dataset.kinds || "").split(" ").filter(Boolean)) {
    source.addEventListener(kind, function (event) {
      let data = {};
      try { data = JSON.parse(event.data); } catch (error) { /* a frame we do not know */ }
      note(kind, data);
      soon();
    });
  }
  setInterval(function () { if (!document.hidden) soon(0); }, POLL_MS);
})();
