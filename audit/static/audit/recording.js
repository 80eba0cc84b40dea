// A call's recording on its page (templates/admin/audit/auditrecord/change_form.html): asciinema-player, vendored
// beside this file, on the call's asciicast (audit/recording_views.py), a speed selector, and a search through what
// the call printed whose hits seek the player. The recording is fetched once and shared by the player and the search.
// Its text came from an agent's commands: hits are set with textContent, never as HTML, with every control and format
// character spelled out (visible(), as audit/visible.py does on the server's pages).
"use strict";
(() => {
  const MAX_HITS = 200; // listed; the status line counts the rest
  const CONTEXT = 60; // characters of a hit's line shown on each side of it
  const SEARCH_DELAY_MS = 200; // typing pauses this long before the search runs
  // What a terminal acts on rather than shows: escape sequences (CSI, OSC, two-character) and carriage returns.
  const CONTROL = /\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]|\r/g;
  // An escape sequence an event ends in the middle of: the next event finishes it.
  const UNFINISHED = /\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*)?$/;
  // The characters audit/visible.py spells out, as mcpserver/static/mcpserver/console_live.js holds them (a test
  // keeps the two the same).
  const HIDDEN =
    /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\u{110bd}\u{110cd}\u{13430}-\u{1343f}\u{1bca0}-\u{1bca3}\u{1d173}-\u{1d17a}\u{e0001}\u{e0020}-\u{e007f}\p{Cf}]|\r(?!\n)/gu;

  // What only a program that draws on the screen sends (cursor moves, erasing, the alternate screen): its output is
  // laid out for the recorded size, which the player then keeps.
  const DRAWS = /\x1b\[[0-9;?]*[ABCDEFGHJKSTdfsu]|\x1b\[\?1049|\x1b[78]/;
  const WIDE = /[\u1100-\u115f\u2e80-\ua4cf\uac00-\ud7a3\uf900-\ufaff\ufe30-\ufe4f\uff00-\uff60\uffe0-\uffe6\u{1f300}-\u{1faff}\u{20000}-\u{3fffd}]/u;
  const MIN_COLS = 100;
  const MIN_ROWS = 10;

  document.addEventListener("DOMContentLoaded", () => {
    const section = document.getElementById("recording");
    if (section && section.dataset.cast && window.AsciinemaPlayer) new Replay(section).start();
  });

  function visible(text) {
    return String(text).replace(HIDDEN, (hidden) => {
      const code = hidden.codePointAt(0).toString(16).toUpperCase().padStart(4, "0");
      return `\u27eaU+${code}\u27eb`;
    });
  }

  function clock(seconds) {
    const minutes = Math.floor(seconds / 60);
    return `${minutes}:${(seconds - minutes * 60).toFixed(1).padStart(4, "0")}`;
  }

  function span(className, text) {
    const node = document.createElement(className === "hit" ? "mark" : "span");
    node.className = `audit-recording-${className}`;
    node.textContent = visible(text);
    return node;
  }

  // The asciicast's output as one text without the terminal's controls, and where each event starts in it.
  function searchable(cast) {
    const starts = [];
    const times = [];
    let text = "";
    let carried = "";
    let draws = false;
    for (const line of cast.split("\n").slice(1)) {
      let event;
      try {
        event = JSON.parse(line);
      } catch (error) {
        continue; // the empty line after the last event
      }
      if (!Array.isArray(event) || event[1] !== "o" || typeof event[2] !== "string") continue;
      let printed = carried + event[2];
      draws = draws || DRAWS.test(printed);
      const open = printed.match(UNFINISHED);
      carried = open ? open[0] : "";
      if (open) printed = printed.slice(0, open.index);
      starts.push(text.length);
      times.push(Number(event[0]));
      text += printed.replace(CONTROL, "");
    }
    return { text, starts, times, draws };
  }

  function columns(line) {
    let width = 0;
    for (const character of line) width += character === "\t" ? 8 : WIDE.test(character) ? 2 : 1;
    return width;
  }

  // The asciicast with a screen no larger than its lines need, when they are plain lines: the recorded size (160 x 40)
  // fitted to the page's width would print a few short lines in a tiny font. Output that draws keeps its size.
  function fitted(cast, recording) {
    const newline = cast.indexOf("\n");
    let header;
    try {
      header = JSON.parse(cast.slice(0, newline));
    } catch (error) {
      return cast; // the player says what is wrong with it
    }
    if (recording.draws || !(header.width > 0 && header.height > 0)) return cast;
    const lines = recording.text.split("\n");
    let cols = MIN_COLS;
    for (const line of lines) cols = Math.max(cols, columns(line));
    const width = Math.min(header.width, cols);
    const height = Math.min(header.height, Math.max(MIN_ROWS, lines.length));
    return JSON.stringify({ ...header, width, height }) + cast.slice(newline);
  }

  // The time of the event that printed the character at `offset`: a hit is on the screen once its last one is.
  function timeAt(recording, offset) {
    let low = 0;
    let high = recording.starts.length - 1;
    while (low < high) {
      const middle = Math.ceil((low + high) / 2);
      if (recording.starts[middle] <= offset) low = middle;
      else high = middle - 1;
    }
    return recording.times[low] || 0;
  }

  class Replay {
    constructor(section) {
      this.section = section;
      this.url = section.dataset.cast;
      this.mount = document.getElementById("recording-player");
      this.speed = document.getElementById("recording-speed");
      this.query = document.getElementById("recording-query");
      this.status = document.getElementById("recording-search-status");
      this.hits = document.getElementById("recording-hits");
      this.loaded = null; // the promise of load()
      this.player = null;
      this.playing = false;
      this.timer = null;
    }

    start() {
      this.create(0, false);
      this.speed.addEventListener("change", () => this.create(this.player.getCurrentTime() || 0, this.playing));
      document.getElementById("recording-search").addEventListener("submit", (event) => {
        event.preventDefault();
        this.search();
      });
      this.query.addEventListener("input", () => {
        clearTimeout(this.timer);
        this.timer = setTimeout(() => this.search(), SEARCH_DELAY_MS);
      });
    }

    // The asciicast, fitted for the player, and its searchable text: fetched and worked out once.
    load() {
      if (!this.loaded) {
        this.loaded = fetch(this.url, { credentials: "same-origin" })
          .then((response) => {
            if (!response.ok) throw new Error(`the recording could not be read (HTTP ${response.status})`);
            return response.text();
          })
          .then((cast) => {
            const recording = searchable(cast);
            return { played: fitted(cast, recording), recording };
          });
        this.loaded.catch(() => {
          this.loaded = null; // the next search or player tries again
        });
      }
      return this.loaded;
    }

    // The player has no setting for its speed once made: a new one, at the same time and playing if this one was.
    create(startAt, autoPlay) {
      if (this.player) this.player.dispose();
      const speed = Number(this.speed.value) || 1;
      const options = { speed, startAt, autoPlay, preload: true, fit: "width" };
      const source = { data: () => this.load().then(({ played }) => played) };
      const player = AsciinemaPlayer.create(source, this.mount, options);
      this.playing = autoPlay;
      player.addEventListener("play", () => { this.playing = true; });
      player.addEventListener("pause", () => { this.playing = false; });
      player.addEventListener("ended", () => { this.playing = false; });
      this.player = player;
      this.section.player = player; // for the page's tests, which read its current time
    }

    async search() {
      clearTimeout(this.timer);
      const query = this.query.value;
      this.hits.replaceChildren();
      if (!query) {
        this.status.textContent = "";
        return;
      }
      this.status.textContent = "Searching…";
      let recording;
      try {
        ({ recording } = await this.load());
      } catch (error) {
        this.status.textContent = `Cannot search: ${error.message}.`;
        return;
      }
      if (query !== this.query.value) return; // a newer search has started
      this.show(recording, query);
    }

    show(recording, query) {
      const pattern = new RegExp(query.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"), "gi");
      const items = [];
      let count = 0;
      for (const found of recording.text.matchAll(pattern)) {
        count += 1;
        if (items.length < MAX_HITS) items.push(this.hit(recording, found.index, found[0].length));
      }
      this.hits.replaceChildren(...items);
      const shown = count > MAX_HITS ? ` (the first ${MAX_HITS} listed)` : "";
      this.status.textContent = count
        ? `${count} ${count === 1 ? "match" : "matches"}${shown}: choose one to see the screen at that moment.`
        : `No match for “${visible(query)}”.`;
    }

    hit(recording, start, length) {
      const text = recording.text;
      const end = start + length;
      const time = timeAt(recording, end - 1);
      const lineStart = text.lastIndexOf("\n", start - 1) + 1;
      const lineEnd = text.includes("\n", end) ? text.indexOf("\n", end) : text.length;
      const from = Math.max(lineStart, start - CONTEXT);
      const to = Math.min(lineEnd, end + CONTEXT);
      const button = document.createElement("button");
      button.type = "button";
      button.dataset.time = String(time);
      const line = span("line", "");
      line.append(
        `${from > lineStart ? "…" : ""}${visible(text.slice(from, start))}`,
        span("hit", text.slice(start, end)),
        `${visible(text.slice(end, to))}${to < lineEnd ? "…" : ""}`,
      );
      button.append(span("time", clock(time)), line);
      button.addEventListener("click", () => this.seek(button, time));
      const item = document.createElement("li");
      item.append(button);
      return item;
    }

    seek(button, time) {
      for (const chosen of this.hits.querySelectorAll("button[aria-current]")) chosen.removeAttribute("aria-current");
      button.setAttribute("aria-current", "true");
      this.player.seek(time);
    }
  }
})();
