// The console's live view over one WebSocket (mcpserver/console_socket.py): approval cards on every console page,
// and on the Live page (/admin/live/) the running calls with their output, the background commands and their Stop
// buttons. Everything shown comes from agents and their clients: it is set with textContent, never as HTML, and with
// every control and format character spelled out (visible(), as audit/visible.py does on the server's pages).
//
// Messages are merged into `incoming` as they arrive and drawn once per animation frame, so a burst of calls or a
// command printing fast costs one DOM update per frame, and a hidden tab holds a bounded amount of it.
"use strict";
(() => {
  const script = document.currentScript;
  const OUTPUT_LIMIT = 64 * 1024; // characters of output kept per call on the page
  const OUTPUT_KEEP = 48 * 1024; // what is left after a trim: trims are rare, not once per line
  const ENDED_KEPT = 20; // ended calls left on the page (newest), marked with their outcome
  const DECIDED_SHOWN_MS = 4000; // a decided card says who decided, then goes
  const BACKOFF_FIRST_MS = 500;
  const BACKOFF_MAX_MS = 30000;
  const CLOSE_REFUSED = 4403;
  const MAX_GRANT_MINUTES = 1440;
  const CORNER_LINES = 12; // a longer command is not decided in the corner of a page: the Live page shows it whole
  const CORNER_CHARS = 1200;

  document.addEventListener("DOMContentLoaded", () => {
    const live = document.getElementById("live-page");
    const view = new View(live);
    new Connection(script.dataset.socket, Boolean(live), view).open();
  });

  // The characters audit/visible.py spells out, in the same two classes (C0 but tab, newline and CR, DEL and C1; the
  // format characters, Cf), with the browser's own Cf set added: U+202E would reverse the text after it, U+200B hide
  // in it, ESC and a lone CR pose as a terminal's doing. A CR before a newline lays out text and stays.
  const HIDDEN =
    /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\u{110bd}\u{110cd}\u{13430}-\u{1343f}\u{1bca0}-\u{1bca3}\u{1d173}-\u{1d17a}\u{e0001}\u{e0020}-\u{e007f}\p{Cf}]|\r(?!\n)/gu;
  // The mark the audit log leaves where it cut a long value (audit/excerpt.py): in a command, or in the JSON of
  // other arguments. An agent could write one itself: the card then warns of a cut that is not there, never the reverse.
  const CUT_MARK = /\[\.\.\. (\d+) bytes not kept; sha256 of the whole: [0-9a-f]{64} \.\.\.\]/g;

  function visible(text) {
    return String(text).replace(HIDDEN, (hidden) => {
      const code = hidden.codePointAt(0).toString(16).toUpperCase().padStart(4, "0");
      return `\u27eaU+${code}\u27eb`;
    });
  }

  function hiddenCount(text) {
    return (String(text).match(HIDDEN) || []).length;
  }

  function bytesCut(text) {
    let bytes = 0;
    for (const found of String(text).matchAll(CUT_MARK)) bytes += Number(found[1]);
    return bytes;
  }

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = visible(text);
    return node;
  }

  // What the agent said its command is for: its words, marked as such (never taken for the console's).
  function agentSays(className, text) {
    const line = el("p", `agent-says ${className}`);
    line.append(el("span", "agent-says-label", "The agent says: "), el("q", "agent-says-words", text));
    return line;
  }

  function duration(seconds) {
    seconds = Math.max(0, Math.floor(seconds));
    const hours = Math.floor(seconds / 3600);
    const minutes = Math.floor((seconds % 3600) / 60);
    const rest = String(seconds % 60).padStart(2, "0");
    return hours ? `${hours}:${String(minutes).padStart(2, "0")}:${rest}` : `${minutes}:${rest}`;
  }

  // --- the socket ----------------------------------------------------------------------------------------------

  class Connection {
    constructor(path, livePage, view) {
      const scheme = location.protocol === "https:" ? "wss:" : "ws:";
      this.url = `${scheme}//${location.host}${path}${livePage ? "?live=1" : ""}`;
      this.view = view;
      this.backoff = BACKOFF_FIRST_MS;
      this.nextRef = 1;
      this.waiting = new Map(); // ref -> the callback of an action's result
      view.send = (action, done) => this.send(action, done);
    }

    open() {
      const socket = new WebSocket(this.url);
      this.socket = socket;
      let opened = false;
      socket.addEventListener("open", () => {
        opened = true;
        this.backoff = BACKOFF_FIRST_MS;
        this.view.status("connected", "Connected: changes appear as they happen.");
      });
      socket.addEventListener("message", (event) => this.receive(event.data));
      socket.addEventListener("close", (event) => {
        for (const done of this.waiting.values()) done({ ok: false, message: "the connection was lost" });
        this.waiting.clear();
        if (opened && event.code === CLOSE_REFUSED) {
          this.view.status("refused", "Signed out of the console: reload the page to sign in again.");
          return; // the session ended or lost its rights: trying again would not help
        }
        const delay = this.backoff * (0.8 + Math.random() * 0.4);
        this.backoff = Math.min(this.backoff * 2, BACKOFF_MAX_MS);
        this.view.status("down", `Not connected: trying again in ${Math.ceil(delay / 1000)} s`);
        setTimeout(() => this.open(), delay);
      });
    }

    receive(data) {
      let message;
      try {
        message = JSON.parse(data);
      } catch (error) {
        return;
      }
      if (message.type === "result") {
        const done = this.waiting.get(message.ref);
        this.waiting.delete(message.ref);
        if (done) done(message);
      } else if (message.type === "snapshot" || message.type === "batch") {
        this.view.take(message);
      }
    }

    send(action, done) {
      if (!this.socket || this.socket.readyState !== WebSocket.OPEN) {
        done({ ok: false, message: "not connected: try again in a moment" });
        return;
      }
      const ref = this.nextRef++;
      this.waiting.set(ref, done);
      this.socket.send(JSON.stringify({ ...action, ref }));
    }
  }

  // --- what the page shows -------------------------------------------------------------------------------------

  class View {
    constructor(live) {
      this.live = live;
      this.send = null;
      this.clockOffset = 0; // server time minus this browser's, from the snapshot
      this.incoming = null;
      this.frame = false;
      this.cards = new Map(); // request id -> Card
      this.calls = new Map(); // call id -> CallRow
      this.ended = []; // CallRows that ended, oldest first
      this.focus = live ? Number(live.dataset.focus || 0) : 0;
      this.cardBox = live ? document.getElementById("live-approvals-cards") : null;
      if (!this.cardBox) {
        this.cardBox = el("div", "approval-cards");
        this.cardBox.id = "approval-cards";
        this.cardBox.setAttribute("aria-live", "polite");
        document.body.appendChild(this.cardBox);
      }
      this.navLink = document.getElementById("nav-live");
      this.liveUrl = this.navLink ? this.navLink.getAttribute("href") : "/admin/live/";
      this.reset();
      setInterval(() => this.tick(), 1000);
    }

    now() {
      return Date.now() + this.clockOffset;
    }

    reset() {
      this.incoming = {
        snapshot: null, calls: new Map(), output: new Map(), units: new Map(), ended: new Map(), seconds: new Map(),
        approvals: new Map(), background: null,
      };
    }

    status(state, text) {
      const box = document.getElementById("live-status");
      if (box) {
        box.textContent = text;
        box.dataset.state = state;
      }
    }

    take(message) {
      const incoming = this.incoming;
      if (message.type === "snapshot") {
        this.reset(); // the snapshot holds everything: changes queued before it are older
        this.incoming.snapshot = message;
        const serverTime = Date.parse(message.server_time);
        if (!Number.isNaN(serverTime)) this.clockOffset = serverTime - Date.now();
      } else {
        for (const call of message.calls || []) incoming.calls.set(call.call_id, call);
        for (const [callId, text] of Object.entries(message.output || {})) {
          incoming.output.set(callId, ((incoming.output.get(callId) || "") + text).slice(-OUTPUT_LIMIT));
        }
        for (const [callId, units] of Object.entries(message.output_units || {})) incoming.units.set(callId, units);
        for (const [callId, outcome] of Object.entries(message.ended || {})) incoming.ended.set(callId, outcome);
        for (const [callId, seconds] of Object.entries(message.seconds || {})) incoming.seconds.set(callId, seconds);
        for (const approval of message.approvals || []) incoming.approvals.set(approval.id, approval);
        if (Array.isArray(message.background)) incoming.background = message.background;
      }
      if (!this.frame) {
        this.frame = true;
        requestAnimationFrame(() => this.draw());
      }
    }

    draw() {
      this.frame = false;
      const incoming = this.incoming;
      this.reset();
      const snapshot = incoming.snapshot;
      if (snapshot) {
        this.replaceCards(snapshot.approvals || []);
        if (this.live) {
          this.replaceCalls(snapshot.calls || [], snapshot.ended_calls || []);
          this.drawBackground(snapshot.background || []);
        }
      }
      for (const approval of incoming.approvals.values()) this.approval(approval);
      if (this.live) {
        for (const call of incoming.calls.values()) this.call(call);
        for (const [callId, text] of incoming.output) this.calls.get(callId)?.append(text, false, incoming.units.get(callId));
        for (const [callId, outcome] of incoming.ended) this.endCall(callId, outcome, incoming.seconds.get(callId));
        if (incoming.background) this.drawBackground(incoming.background);
        this.drawEmptyNotes();
      }
      this.drawCount();
    }

    tick() {
      const now = this.now();
      for (const card of this.cards.values()) card.tick(now);
      for (const row of this.calls.values()) row.tick();
    }

    // approvals

    replaceCards(approvals) {
      const seen = new Set(approvals.map((approval) => approval.id));
      for (const [id, card] of this.cards) {
        if (!seen.has(id)) this.dropCard(id, card);
      }
      for (const approval of approvals) this.approval(approval);
    }

    approval(approval) {
      const card = this.cards.get(approval.id);
      if (approval.state !== "pending") {
        if (card) {
          card.decided(approval);
          setTimeout(() => this.dropCard(approval.id, card), DECIDED_SHOWN_MS);
        }
        return;
      }
      if (card) {
        card.update(approval);
        return;
      }
      const made = new Card(approval, this);
      this.cards.set(approval.id, made);
      this.cardBox.prepend(made.root); // newest first
      made.tick(this.now());
      if (approval.id === this.focus) {
        made.root.classList.add("approval-card-focused");
        made.root.scrollIntoView({ block: "nearest" });
      }
    }

    dropCard(id, card) {
      if (this.cards.get(id) === card) this.cards.delete(id);
      card.root.remove();
      this.drawCount();
    }

    drawCount() {
      const waiting = [...this.cards.values()].filter((card) => !card.done).length;
      if (this.navLink) {
        let badge = this.navLink.querySelector(".live-count");
        if (!badge) {
          badge = el("span", "live-count");
          this.navLink.appendChild(badge);
        }
        badge.textContent = waiting ? String(waiting) : "";
        badge.hidden = !waiting;
      }
      const note = document.getElementById("live-approvals-empty");
      if (note) note.hidden = waiting > 0;
    }

    // calls (the Live page)

    replaceCalls(calls, endedCalls) {
      const seen = new Set(calls.map((call) => call.call_id));
      for (const [callId, row] of this.calls) {
        if (!seen.has(callId)) this.endCall(callId, "ended");
      }
      // Calls that ended before this page opened (or while it was away): shown as they ended, oldest first.
      const shown = new Set(this.ended.map((row) => row.callId));
      for (const call of endedCalls) {
        if (shown.has(call.call_id) || this.calls.has(call.call_id)) continue;
        const row = this.call(call);
        this.endCall(call.call_id, call.outcome || "ended", call.elapsed);
        row.pickUp(call.recording_url);
      }
      for (const call of calls) this.call(call)?.pickUp(call.recording_url);
    }

    call(call) {
      let row = this.calls.get(call.call_id);
      const fresh = !row;
      if (fresh) {
        row = new CallRow(call, this);
        this.calls.set(call.call_id, row);
        document.getElementById("live-calls").prepend(row.root);
        if (call.output) row.append(call.output, false, call.output_units);
      }
      row.update(call);
      return fresh ? row : null;
    }

    endCall(callId, outcome, seconds) {
      const row = this.calls.get(callId);
      if (!row) return;
      this.calls.delete(callId);
      row.end(outcome, seconds);
      this.ended.push(row);
      while (this.ended.length > ENDED_KEPT) this.ended.shift().root.remove();
    }

    drawEmptyNotes() {
      const note = document.getElementById("live-calls-empty");
      if (note) note.hidden = this.calls.size > 0;
    }

    // background commands (the Live page)

    drawBackground(rows) {
      const body = document.getElementById("live-background-rows");
      if (!body) return;
      const fresh = rows.map((row) => this.backgroundRow(row));
      body.replaceChildren(...fresh);
      document.getElementById("live-background-empty").hidden = rows.length > 0;
      document.getElementById("live-background-table").hidden = rows.length === 0;
    }

    backgroundRow(job) {
      const tr = el("tr", "live-job");
      tr.dataset.id = job.id;
      tr.append(el("td", "live-job-pid", job.pid), el("td", "live-job-user", job.username));
      const command = el("td", "live-job-command");
      command.append(el("code", "", job.command));
      const state = el("td", `live-job-state live-job-state-${job.state}`, job.state_text);
      const actions = el("td", "live-job-actions");
      if (job.state === "running") {
        const stop = el("button", "button live-job-stop", "Stop");
        stop.type = "button";
        const said = el("span", "live-said");
        stop.addEventListener("click", () => {
          stop.disabled = true;
          this.send({ action: "stop_background", id: job.id }, (result) => {
            said.textContent = visible(result.message);
            said.dataset.ok = result.ok;
            if (!result.ok) stop.disabled = false;
          });
        });
        actions.append(stop, said);
      }
      tr.append(command, el("td", "live-job-started", new Date(job.started_at).toLocaleString()), state, actions);
      return tr;
    }
  }

  // --- one approval card ---------------------------------------------------------------------------------------

  class Card {
    constructor(approval, view) {
      this.view = view;
      this.done = false;
      this.expires = Date.parse(approval.expires_at);
      const root = el("section", "approval-card");
      root.dataset.id = approval.id;
      root.setAttribute("aria-label", `approval request ${approval.label}`);
      this.root = root;

      const head = el("header", "approval-head");
      head.append(el("strong", "approval-label", approval.label), " ", el("span", "approval-tool", approval.tool));
      this.countdown = el("span", "approval-expiry");
      head.append(this.countdown);
      root.append(head);

      const who = el("dl", "approval-who");
      const credential = approval.credential_name || approval.credential_key;
      for (const [term, value] of [["User", approval.username], ["Credential", credential], ["Client", approval.client], ["Address", approval.address]]) {
        if (value) who.append(el("dt", "", term), el("dd", "", value));
      }
      root.append(who);
      const whole = Boolean(view.live) || fitsTheCorner(approval.summary);
      root.append(...this.command(approval, whole));
      if (approval.description) root.append(agentSays("approval-description", approval.description));

      const where = el("dl", "approval-where");
      if (approval.cwd) where.append(el("dt", "", "Directory"), el("dd", "approval-cwd", approval.cwd));
      const rule = approval.rule_reason ? `${approval.rule_id}: ${approval.rule_reason}` : approval.rule_id;
      where.append(el("dt", "", "Rule"), el("dd", "approval-rule", rule));
      root.append(where);
      this.held = el("p", "approval-held", "The agent was told this call is pending; an approval runs it without the agent.");
      root.append(this.held);

      this.buttons = [];
      const once = this.button("Approve once", "approval-approve-once", () => ({ action: "approve", id: approval.id, minutes: null }));
      const grantRow = el("div", "approval-row");
      this.minutes = el("input", "approval-minutes");
      Object.assign(this.minutes, { type: "number", min: "1", max: String(MAX_GRANT_MINUTES), step: "1", value: "10" });
      this.minutes.setAttribute("aria-label", "minutes");
      const grant = this.button("Approve this credential for", "approval-approve-grant", () => {
        const minutes = Number(this.minutes.value);
        if (!Number.isInteger(minutes) || minutes < 1 || minutes > MAX_GRANT_MINUTES) {
          this.say(false, `minutes: a whole number from 1 to ${MAX_GRANT_MINUTES}`);
          return null;
        }
        return { action: "approve", id: approval.id, minutes };
      });
      grantRow.append(grant, " ", this.minutes, " minutes ", el("span", "approval-hint", "(same tool and command shape)"));

      const denyRow = el("div", "approval-row");
      this.reason = el("input", "approval-reason");
      Object.assign(this.reason, { type: "text", maxLength: 2000, placeholder: "reason (the agent reads it)" });
      this.reason.setAttribute("aria-label", "reason for denying");
      const deny = this.button("Deny", "approval-deny", () => ({ action: "deny", id: approval.id, reason: this.reason.value }));
      denyRow.append(this.reason, " ", deny);

      const actions = el("div", "approval-actions");
      actions.append(once, grantRow, denyRow);
      if (whole) root.append(actions);
      this.said = el("p", "approval-said");
      this.said.setAttribute("role", "status");
      root.append(this.said);
      this.update(approval);
    }

    // The command in full, wrapped, the card growing to hold it; above it, what it hid and what the audit log cut.
    // In the corner of a page, a command too long to read there is shown in part, with the way to the Live page.
    command(approval, whole) {
      const summary = String(approval.summary);
      const shown = [];
      const hidden = hiddenCount(summary);
      if (hidden) {
        const what = hidden === 1 ? "1 hidden character" : `${hidden} hidden characters`;
        const text = `This command contains ${what}, shown as \u27eaU+\u2026\u27eb.`;
        shown.push(el("p", "approval-warning approval-hidden", text));
      }
      const cut = bytesCut(summary);
      if (cut) {
        const text =
          `Cut: ${cut} bytes of the middle are not shown (the audit log keeps the start and the end); ` +
          "approving runs the whole call.";
        shown.push(el("p", "approval-warning approval-cut", text));
      }
      if (whole) return [...shown, el("pre", "approval-command", summary)];
      const lines = summary.split("\n");
      const start = lines.slice(0, CORNER_LINES).join("\n").slice(0, CORNER_CHARS);
      shown.push(el("pre", "approval-command approval-command-part", start));
      const rest = lines.length > CORNER_LINES ? `${lines.length - CORNER_LINES} more lines` : "The rest";
      const more = el("p", "approval-warning approval-more", `${rest} not shown here: `);
      const link = el("a", "approval-open", `read ${approval.label} whole on the Live page to decide it`);
      link.href = `${this.view.liveUrl}?request=${encodeURIComponent(approval.id)}`;
      more.append(link);
      shown.push(more);
      return shown;
    }

    button(label, className, action) {
      const button = el("button", `button ${className}`, label);
      button.type = "button";
      button.addEventListener("click", () => {
        const chosen = action();
        if (!chosen) return;
        this.enable(false);
        this.view.send(chosen, (result) => {
          this.say(result.ok, result.message);
          if (!result.ok && !this.done) this.enable(true);
        });
      });
      this.buttons.push(button);
      return button;
    }

    enable(on) {
      for (const button of this.buttons) button.disabled = !on;
    }

    say(ok, text) {
      this.said.textContent = visible(text);
      this.said.dataset.ok = ok;
    }

    update(approval) {
      this.held.hidden = !approval.held;
    }

    decided(approval) {
      this.done = true;
      this.enable(false);
      this.root.classList.add("approval-card-decided");
      const state = approval.state.replace("_", " ");
      const by = approval.decided_by ? ` by ${approval.decided_by}` : "";
      const channel = approval.channel ? ` (${approval.channel})` : "";
      const reason = approval.state === "denied" && approval.reason ? `: ${approval.reason}` : "";
      const grant = approval.grant_minutes ? `, this credential for ${approval.grant_minutes} minutes` : "";
      this.say(approval.state === "approved", `${approval.label} ${state}${by}${channel}${grant}${reason}`);
      this.countdown.textContent = "";
    }

    tick(now) {
      if (this.done) return;
      const left = (this.expires - now) / 1000;
      if (left <= 0) {
        this.countdown.textContent = "expired";
        this.enable(false);
        return;
      }
      this.countdown.textContent = `expires in ${duration(left)}`;
    }
  }

  function fitsTheCorner(summary) {
    const text = String(summary);
    return text.length <= CORNER_CHARS && text.split("\n").length <= CORNER_LINES && !bytesCut(text);
  }

  // --- one running call (the Live page) ------------------------------------------------------------------------

  class CallRow {
    constructor(call, view) {
      this.view = view;
      this.callId = call.call_id;
      this.length = 0;
      this.carried = "";
      this.received = ""; // the output as it came since the row was made, whole, for pickUp (null: too much)
      this.receivedFrom = null; // the call's output, in UTF-16 units, before `received` began
      this.whole = null; // the output from the recording, once picked up
      this.began = performance.now() - (call.elapsed || 0) * 1000;
      const root = el("article", "live-call");
      root.dataset.callId = call.call_id;
      this.root = root;
      const head = el("header", "live-call-head");
      this.state = el("span", "live-call-state");
      this.elapsed = el("span", "live-call-elapsed");
      head.append(el("strong", "live-call-tool", call.tool), " ", this.state, " ", this.elapsed);
      const who = call.credential_name ? `${call.username} · ${call.credential_name}` : call.username;
      head.append(el("span", "live-call-who", who));
      if (call.address) head.append(el("span", "live-call-address", call.address));
      this.stop = el("button", "button live-call-stop", "Stop");
      this.stop.type = "button";
      this.said = el("span", "live-said");
      this.stop.addEventListener("click", () => {
        this.stop.disabled = true;
        view.send({ action: "stop", call_id: call.call_id }, (result) => {
          this.said.textContent = visible(result.message);
          this.said.dataset.ok = result.ok;
          if (!result.ok) this.stop.disabled = false;
        });
      });
      head.append(this.stop);
      if (call.revoke_url) {
        const revoke = el("a", "live-call-revoke", "Revoke credential");
        revoke.href = call.revoke_url; // a path the server made (reverse()), never agent text
        head.append(revoke);
      }
      head.append(this.said);
      root.append(head, el("pre", "live-call-summary", call.summary));
      if (call.description) root.append(agentSays("live-call-description", call.description));
      // Past OUTPUT_LIMIT the page keeps the newest output; the call's page replays all of it from the recording.
      this.trimmed = el("p", "live-call-trimmed", "Earlier output is left out here: ");
      this.trimmed.hidden = true;
      if (call.page_url) {
        const whole = el("a", "live-call-whole", "the call's page replays all of it");
        whole.href = call.page_url; // a path the server made (reverse()), never agent text
        this.trimmed.append(whole);
      } else {
        this.trimmed.append("the call's page replays all of it");
      }
      this.output = el("pre", "live-call-output");
      root.append(this.trimmed, this.output);
      this.tick();
    }

    update(call) {
      const waiting = call.state === "awaiting_approval";
      this.state.textContent = waiting ? `awaiting approval ${call.approval}` : "running";
      this.state.dataset.state = call.state;
    }

    append(raw, last = false, unitsAfter = undefined) {
      // A row shows at most OUTPUT_LIMIT characters (UTF-16 units, as the server counts them): past that, the start
      // is left out, whichever way the output came.
      if (unitsAfter !== undefined && unitsAfter > OUTPUT_LIMIT) this.trimmed.hidden = false;
      if (this.receivedFrom === null && unitsAfter !== undefined) {
        this.receivedFrom = unitsAfter - raw.length;
        if (this.receivedFrom > 0 && this.whole === null) this.trimmed.hidden = false; // the server sent its tail
      }
      if (this.whole !== null) this.whole += raw;
      else if (this.received !== null) {
        this.received += raw;
        if (this.received.length > OUTPUT_LIMIT) this.received = null; // the page shows the newest from here on
      }
      this.show(raw, last);
    }

    show(raw, last = false) {
      // A CR that ends a chunk may start the next one's CRLF: it is spelled out (or not) once that chunk comes.
      let text = this.carried + raw;
      this.carried = !last && text.endsWith("\r") ? "\r" : "";
      text = visible(this.carried ? text.slice(0, -1) : text);
      const output = this.output;
      const atBottom = output.scrollTop + output.clientHeight >= output.scrollHeight - 4;
      if (this.length + text.length > OUTPUT_LIMIT) {
        const kept = (output.textContent + text).slice(-OUTPUT_KEEP);
        output.textContent = kept;
        this.length = kept.length;
        this.trimmed.hidden = false;
      } else {
        output.appendChild(document.createTextNode(text));
        this.length += text.length;
      }
      if (atBottom) output.scrollTop = output.scrollHeight;
    }

    pickUp(url) {
      // The output so far from the call's recording: a page opened while (or after) it ran shows all of it, not
      // only the tail the server keeps in memory. What arrives meanwhile is added after what the recording had.
      if (!url) return;
      fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then((answer) => (answer.ok ? answer.json() : null))
        .then((recorded) => {
          if (!recorded || typeof recorded.text !== "string") return;
          if (this.received === null) {
            // More came meanwhile than the page keeps: what it shows is the newest already.
            this.trimmed.hidden = false;
            return;
          }
          const from = this.receivedFrom === null ? recorded.units : this.receivedFrom;
          const newer = this.received.slice(Math.max(0, recorded.units - from));
          this.whole = recorded.text + newer;
          this.output.textContent = "";
          this.length = 0;
          this.carried = "";
          this.trimmed.hidden = this.whole.length <= OUTPUT_LIMIT; // the whole output, from its first byte
          this.show(this.whole.slice(-OUTPUT_LIMIT), this.endedAs !== undefined);
        })
        .catch(() => {}); // no recording to pick up (or no right to read it): the tail stays
    }

    tick() {
      if (this.endedAs === undefined) this.elapsed.textContent = duration((performance.now() - this.began) / 1000);
    }

    end(outcome, seconds) {
      if (this.carried) this.show("", true); // no CRLF came: the CR was alone
      if (typeof seconds === "number") this.elapsed.textContent = duration(seconds); // how long it ran, not the last tick
      this.endedAs = outcome;
      this.root.classList.add("live-call-ended");
      this.state.textContent = `ended: ${outcome}`;
      this.state.dataset.state = "ended";
      this.stop.remove();
    }
  }
})();
