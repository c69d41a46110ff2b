// Holdpoint dashboard behaviour. Every page works without this file; it adds live countdowns,
// live pushes that keep what a person is typing,
// the user's time zone, "add another" for lists, Ctrl/Cmd+Enter, and busy buttons.
// No inline scripts anywhere (CSP script-src 'self'); htmx does the requests.
(function () {
  "use strict";

  document.documentElement.classList.add("js");

  // Words come from Django's JavaScript catalog (/jsi18n/, loaded just before this file) in
  // the page's language; without it they stay English. Named gettext so makemessages finds them.
  var gettext =
    typeof window.gettext === "function"
      ? window.gettext
      : function (text) {
          return text;
        };
  function fill(text, values) {
    return text.replace(/%\((\w+)\)s/g, function (all, name) {
      return String(values[name]);
    });
  }

  // --- Time zone: the server renders times in the zone this cookie names. -----------------
  try {
    var zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
    var current = (document.cookie.match(/(?:^|;\s*)tz=([^;]*)/) || [])[1];
    // Zone names are letters, digits and _ + - / only; anything else is not stored.
    if (zone && /^[A-Za-z0-9_+\-\/]{1,64}$/.test(zone) && current !== zone) {
      document.cookie = "tz=" + zone + "; path=/; max-age=31536000; samesite=lax";
    }
  } catch (e) {
    /* Old browsers: times stay in the server's zone, which they name. */
  }

  // --- Countdowns ---------------------------------------------------------------------------
  function span(seconds) {
    seconds = Math.max(0, Math.floor(seconds));
    var d = Math.floor(seconds / 86400);
    var h = Math.floor((seconds % 86400) / 3600);
    var m = Math.floor((seconds % 3600) / 60);
    var s = seconds % 60;
    // The same words as dashboard.present.span, which rendered the first value.
    if (d) return fill(gettext("%(d)sd %(h)sh"), { d: d, h: h });
    if (h) return fill(gettext("%(h)sh %(m)sm"), { h: h, m: m });
    if (m) return fill(gettext("%(m)sm %(s)ss"), { m: m, s: (s < 10 ? "0" : "") + s });
    return fill(gettext("%(s)ss"), { s: s });
  }

  function expireCard(card) {
    if (!card || card.classList.contains("is-expired")) return;
    card.classList.add("is-expired");
    var form = card.querySelector("form.answer-form");
    if (!form) return;
    // The server refuses a late answer anyway; this only says so before anyone types.
    form.querySelectorAll("button, input, textarea, select").forEach(function (el) {
      if (el.type !== "hidden") el.disabled = true;
    });
    var note = document.createElement("p");
    note.className = "flash flash-error";
    note.setAttribute("role", "alert");
    note.textContent = form.dataset.expiredText || gettext("This request has expired and can no longer be answered.");
    form.prepend(note);
  }

  function tick() {
    var now = Date.now();
    document.querySelectorAll("time[data-countdown]").forEach(function (el) {
      var left = (Date.parse(el.getAttribute("datetime")) - now) / 1000;
      if (left > 0) {
        el.textContent = (el.dataset.fmtLeft || gettext("Expires in {}")).replace("{}", span(left));
      } else {
        el.textContent = el.dataset.fmtGone || gettext("Expired");
        var wrap = el.closest(".countdown");
        if (wrap) wrap.classList.add("is-expired");
        expireCard(el.closest("[data-request-card]"));
      }
    });
  }

  // --- Repeatable list inputs -----------------------------------------------------------------
  // The server renders a list twice: disabled inputs (one per value) and a textarea (one value
  // per line) for pages without JavaScript. Here the inputs take over and the textarea leaves,
  // so the form sends each value once.
  function listInputs(root) {
    if (!root || !root.querySelectorAll) return;
    root.querySelectorAll("[data-list]").forEach(function (list) {
      list.querySelectorAll("[data-list-input]").forEach(function (input) {
        input.disabled = false;
      });
      var text = list.querySelector("[data-list-text]");
      if (text) text.disabled = true;
    });
  }
  htmx.onLoad(listInputs);
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-add-item]");
    if (!button) return;
    var list = button.closest("[data-list]");
    var items = list && list.querySelector("[data-list-items]");
    var last = items && items.lastElementChild;
    if (!last) return;
    var copy = last.cloneNode(false);
    copy.value = "";
    copy.removeAttribute("aria-invalid");
    var label = (copy.getAttribute("aria-label") || "").replace(/\s*\d+$/, "");
    copy.setAttribute("aria-label", label + " " + (items.children.length + 1));
    items.appendChild(copy);
    copy.focus();
  });

  // --- Edit before approving: which planned arguments the person changed, said as they type. ---
  // The server compares the submitted arguments with the plan again; this is only the live view.
  function editValues(box) {
    var values = {};
    box.querySelectorAll("input[name], textarea[name], select[name]").forEach(function (el) {
      if (el.disabled) return;
      if ((el.type === "checkbox" || el.type === "radio") && !el.checked) {
        values[el.name] = values[el.name] || [];
        return;
      }
      (values[el.name] = values[el.name] || []).push(String(el.value).trim());
    });
    return values;
  }
  function fieldLabel(box, name) {
    var el = box.querySelector('[name="' + name.replace(/"/g, "") + '"]');
    var field = el && el.closest(".field, .field-group");
    var label = field && field.querySelector("label, legend, .label");
    return label ? label.textContent.replace(/[*\s]+$/, "").trim() : name;
  }
  function showEdits(box) {
    var note = box.querySelector("[data-edit-diff]");
    if (!note || !box._planned) return;
    var now = editValues(box);
    var changed = [];
    Object.keys(Object.assign({}, box._planned, now)).forEach(function (name) {
      var was = (box._planned[name] || []).filter(Boolean).join("\n");
      var is = (now[name] || []).filter(Boolean).join("\n");
      var field = box.querySelector('[name="' + name.replace(/"/g, "") + '"]');
      var holder = field && field.closest(".field, .field-group");
      if (holder) holder.classList.toggle("is-edited", was !== is);
      if (was !== is) changed.push(fieldLabel(box, name) + ": " + (was || "—") + " → " + (is || "—"));
    });
    note.textContent = changed.length
      ? (note.dataset.changedText || gettext("Changed from what is planned:")) + " " + changed.join("; ")
      : note.dataset.unchangedText || gettext("Unchanged: approving approves the plan as shown.");
    note.classList.toggle("has-edits", changed.length > 0);
  }
  htmx.onLoad(function (root) {
    if (!root || !root.querySelectorAll) return;
    root.querySelectorAll("[data-edit-args]").forEach(function (box) {
      box._planned = editValues(box);
      showEdits(box);
    });
  });
  ["input", "change"].forEach(function (type) {
    document.addEventListener(type, function (event) {
      var box = event.target.closest && event.target.closest("[data-edit-args]");
      if (box) showEdits(box);
    });
  });
  document.addEventListener("click", function (event) {
    var box = event.target.closest && event.target.closest("[data-edit-args]");
    if (box && event.target.closest("[data-add-item]")) setTimeout(function () { showEdits(box); }, 0);
  });

  // --- Told while away: a count in the tab title and a browser notification (issue 18). ----
  // Only while the tab is in the background and the person has not switched it off on their
  // profile; the live socket keeps the inbox badge current, this reads it. The notification
  // says what is asked and the run's label (the server makes each one short line of plain
  // text, dashboard/views/notice.py), and clicking it opens that request's card.
  var baseTitle = document.title;
  var shownCount = null;
  function badgeCount() {
    var badge = document.getElementById("inbox-count");
    var n = badge ? parseInt(badge.textContent, 10) : NaN;
    return isNaN(n) ? null : n;
  }
  function wantsBrowser() {
    return document.body && document.body.dataset.notifyBrowser === "on";
  }
  function onBadge() {
    var n = badgeCount();
    if (n === null) return;
    var grew = shownCount !== null && n > shownCount;
    shownCount = n;
    if (!document.hidden || !wantsBrowser()) return;
    document.title = n > 0 ? "(" + n + ") " + baseTitle : baseTitle;
    if (grew && "Notification" in window && window.Notification.permission === "granted") {
      newest().then(function (notice) { notify(notice, n); });
    }
  }
  // The newest request this person may act on ({title, body, url}), or null.
  function newest() {
    var url = document.body.dataset.notifyUrl;
    if (!url || typeof fetch !== "function") return Promise.resolve(null);
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) { return response.status === 200 ? response.json() : null; })
      .catch(function () { return null; });
  }
  function notify(notice, n) {
    var generic = document.body.dataset.notifyText || gettext("Holdpoint: {} waiting for a person");
    var title = notice && notice.title ? String(notice.title) : generic.replace("{}", String(n));
    var options = { tag: "holdpoint-inbox" };
    if (notice && notice.body) options.body = String(notice.body);
    // Only a link of this site: the card's own page.
    var url = notice && typeof notice.url === "string" && notice.url.charAt(0) === "/" && notice.url.charAt(1) !== "/" ? notice.url : null;
    var note;
    try {
      note = new window.Notification(title, options);
    } catch (e) {
      return; /* Some browsers only notify from a service worker: the title still counts. */
    }
    note.onclick = function () {
      window.focus();
      if (url) window.location.assign(url);
      if (typeof note.close === "function") note.close();
    };
  }
  document.addEventListener("htmx:oobAfterSwap", onBadge);
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) document.title = baseTitle;
    shownCount = badgeCount();
  });
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { baseTitle = document.title; shownCount = badgeCount(); });
  } else {
    shownCount = badgeCount();
  }
  document.addEventListener("click", function (event) {
    var ask = event.target.closest && event.target.closest("[data-ask-notifications]");
    if (!ask || !("Notification" in window)) return;
    window.Notification.requestPermission().then(function (answer) {
      var state = document.querySelector("[data-notification-state]");
      if (state) state.textContent = answer === "granted" ? ask.dataset.grantedText : ask.dataset.deniedText;
    });
  });

  // --- Ctrl/Cmd+Enter submits the focused card's form (docs/dashboard.md). Approvals are excluded: -----
  // --- approving takes a deliberate click on a button that names what it does. ------------
  document.addEventListener("keydown", function (event) {
    if (event.key !== "Enter" || !(event.ctrlKey || event.metaKey)) return;
    var form = event.target.closest && event.target.closest("form[data-submit-shortcut]");
    if (!form) return;
    event.preventDefault();
    var submit = form.querySelector("[data-default-submit]");
    if (submit && !submit.disabled) form.requestSubmit(submit);
  });

  // --- Required means not empty (docs/dashboard.md): said next to the field before anything is sent. ------
  // The server refuses the same answers (runs.schemas); this only saves the round trip.
  function isBlank(el) {
    return !el.disabled && String(el.value || "").trim() === "";
  }
  function emptyRequired(form) {
    var empty = [];
    form.querySelectorAll("[data-list][data-required]").forEach(function (list) {
      var inputs = Array.prototype.slice.call(list.querySelectorAll("[data-list-input]:not([disabled]), [data-list-text]:not([disabled])"));
      if (inputs.length && inputs.every(isBlank)) empty.push(list);
    });
    form.querySelectorAll("fieldset.field-choices[data-required]").forEach(function (set) {
      if (!set.querySelector("input:checked")) empty.push(set);
    });
    form.querySelectorAll("input[required], textarea[required], select[required]").forEach(function (el) {
      if (isBlank(el)) empty.push(el.closest(".field") || el);
    });
    return empty;
  }
  document.addEventListener(
    "submit",
    function (event) {
      var form = event.target;
      if (!form.matches || !form.matches("form.answer-form")) return;
      if (event.submitter && event.submitter.name && event.submitter.name.indexOf("answer") === 0) return;
      form.querySelectorAll("[data-client-error]").forEach(function (el) { el.remove(); });
      var empty = emptyRequired(form);
      if (event.submitter && event.submitter.value !== "approve") {
        // Denying or sending back ignores the edit form: only an approval carries edits.
        empty = empty.filter(function (field) { return !field.closest("[data-edit-args]"); });
      }
      if (!empty.length) return;
      event.preventDefault();
      event.stopImmediatePropagation();
      empty.forEach(function (field) {
        var note = document.createElement("p");
        note.className = "field-error";
        note.setAttribute("data-client-error", "");
        note.textContent = form.dataset.requiredText || gettext("This field is required.");
        field.appendChild(note);
        field.querySelectorAll("input, textarea, select").forEach(function (el) {
          if (!el.disabled && el.type !== "hidden") el.setAttribute("aria-invalid", "true");
        });
      });
      var first = empty[0].querySelector("input:not([disabled]), textarea:not([disabled]), select");
      if (first) first.focus();
    },
    true
  );

  // --- Busy buttons: the clicked one shows progress while htmx disables them all. --------------
  document.addEventListener(
    "submit",
    function (event) {
      if (event.submitter) event.submitter.classList.add("is-busy");
    },
    true
  );
  document.addEventListener("htmx:afterRequest", function (event) {
    var elt = event.detail && event.detail.elt;
    if (elt && elt.querySelectorAll) {
      elt.querySelectorAll(".is-busy").forEach(function (b) {
        b.classList.remove("is-busy");
      });
    }
  });

  // --- Selects that submit their form on change (language). -------------------------------------
  document.addEventListener("change", function (event) {
    if (event.target.matches && event.target.matches("select[data-autosubmit]")) {
      event.target.form.requestSubmit();
    }
  });

  // After a swap, move focus to the message the server sent, so keyboard and screen-reader
  // users hear the outcome and can Tab on from there.
  document.addEventListener("htmx:afterSwap", function (event) {
    tick();
    var target = event.detail && event.detail.target;
    var root = target && document.getElementById(target.id) ? document.getElementById(target.id) : document;
    var flash = root.querySelector && root.querySelector(".flash, .form-error, [aria-invalid='true']");
    if (flash) {
      if (!flash.hasAttribute("tabindex") && !/INPUT|TEXTAREA|SELECT/.test(flash.tagName)) {
        flash.setAttribute("tabindex", "-1");
      }
      flash.focus({ preventScroll: false });
    }
  });

  // The inbox's "Show more": the control is gone with its focus, so move focus to the first
  // card it brought and say how many came (and whether that was all) in the status region.
  // htmx fires afterSwap on every new element; act once, on the new control.
  document.addEventListener("htmx:afterSwap", function (event) {
    var more = event.target;
    if (!more || more.id !== "inbox-more" || !more.hasAttribute("data-announce")) return;
    var status = document.getElementById("inbox-status");
    if (status) status.textContent = more.getAttribute("data-announce");
    var first = more.getAttribute("data-first") && document.getElementById(more.getAttribute("data-first"));
    var focus = first || more.querySelector("a") || more;
    if (!focus.hasAttribute("tabindex") && focus.tagName !== "A") focus.setAttribute("tabindex", "-1");
    focus.focus({ preventScroll: false });
  });

  // --- Inbox rows (docs/dashboard.md): ↑/↓ move between rows, Enter opens one in place (a summary does
  // that by itself), Esc closes it; after an answer the next pending row opens with focus
  // on its first field. A link to #request-… opens that row.
  function rowLines() {
    return Array.prototype.slice.call(document.querySelectorAll("#inbox-list summary.row-line")).filter(function (s) {
      return s.offsetParent !== null;
    });
  }
  function firstField(root) {
    return root.querySelector(".row-body input:not([type=hidden]):not([disabled]), .row-body textarea:not([disabled]), .row-body select:not([disabled]), .row-body button:not([disabled])");
  }
  function openRow(row, focusField) {
    if (!row) return;
    var group = row.closest("details.inbox-group");
    if (group) group.open = true;
    var details = row.querySelector("details.row-details");
    if (details) details.open = true;
    var target = focusField ? firstField(row) : null;
    (target || (details && details.querySelector("summary")) || row).focus({ preventScroll: false });
  }
  document.addEventListener("keydown", function (event) {
    var summary = event.target.closest && event.target.closest("#inbox-list summary.row-line");
    if (summary && (event.key === "ArrowDown" || event.key === "ArrowUp")) {
      var lines = rowLines();
      var at = lines.indexOf(summary);
      var next = lines[at + (event.key === "ArrowDown" ? 1 : -1)];
      if (next) {
        event.preventDefault();
        next.focus();
      }
      return;
    }
    if (event.key === "Escape") {
      var open = event.target.closest && event.target.closest("#inbox-list details[open]");
      if (!open) return;
      event.preventDefault();
      open.open = false;
      var own = open.querySelector("summary");
      if (own) own.focus();
    }
  });
  document.addEventListener("htmx:afterSwap", function (event) {
    var card = event.detail && event.detail.target;
    if (!card || !card.id || card.id.indexOf("request-") !== 0) return;
    var live = document.getElementById(card.id);
    if (!live || !live.classList.contains("inbox-row") || live.hasAttribute("data-pending")) return;
    // Answered: the next pending row of the list (after this one, else the first) opens.
    var rows = Array.prototype.slice.call(document.querySelectorAll("#inbox-list .inbox-row[data-pending]"));
    var after = rows.filter(function (row) {
      return live.compareDocumentPosition(row) & Node.DOCUMENT_POSITION_FOLLOWING;
    });
    var next = after[0] || rows[0];
    if (next) openRow(next, true);
  });
  function openFromHash() {
    var id = window.location.hash.slice(1);
    var row = id && id.indexOf("request-") === 0 && document.getElementById(id);
    if (!row || !row.classList.contains("inbox-row")) return;
    // The card the link names is the one the person came for: it opens in place of the
    // one the page opened first (the most urgent), not beside it.
    document.querySelectorAll("#inbox-list details.row-details[data-opened-first]").forEach(function (other) {
      if (!row.contains(other)) other.open = false;
      other.removeAttribute("data-opened-first");
    });
    openRow(row, false);
  }
  window.addEventListener("hashchange", openFromHash);
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", openFromHash);
  } else {
    openFromHash();
  }

  // --- The run's timeline: pointing at or focusing a mark shows its event under the drawing
  // (without this file, each mark has its SVG <title> and an accessible name); a click
  // follows the mark's link to its event in the list, which :target outlines.
  function chartItem(event) {
    var target = event.target;
    return target && target.closest ? target.closest(".run-chart .tl-item") : null;
  }
  function showChartItem(item) {
    var chart = item.closest(".run-chart");
    var detail = chart && chart.querySelector(".chart-detail");
    if (!detail) return;
    chart.querySelectorAll(".tl-item.is-current").forEach(function (el) { el.classList.remove("is-current"); });
    item.classList.add("is-current");
    detail.textContent = item.getAttribute("aria-label") || "";
  }
  document.addEventListener("focusin", function (event) {
    var item = chartItem(event);
    if (item) showChartItem(item);
  });
  document.addEventListener("mouseover", function (event) {
    var item = chartItem(event);
    if (item) showChartItem(item);
  });

  // --- Live pushes (htmx's ws extension swaps each pushed part in by id, out of band). --------
  // A part whose data-version did not change keeps what the person is doing with it: what
  // they typed into a card or the cancel form, an open dialog. A part with a request of its
  // own in flight (the answer just sent) is left to that request's reply, which brings it up
  // to date; replacing it would orphan the reply. A filtered timeline is fetched again with its
  // filter; a pushed report refresh fetches the report.
  function sameVersion(live, incoming) {
    var version = live && live.getAttribute("data-version");
    return version !== null && version === incoming.getAttribute("data-version");
  }
  function busy(el) {
    return !!el && (el.classList.contains("htmx-request") || !!el.querySelector(".htmx-request"));
  }
  var refreshing = {};
  function refresh(url, target) {
    // One fetch at a time per target; a push during a fetch fetches once more after it.
    if (refreshing[target]) {
      refreshing[target] = "again";
      return;
    }
    refreshing[target] = true;
    function done() {
      var again = refreshing[target] === "again";
      refreshing[target] = false;
      if (again) refresh(url, target);
    }
    if (!document.querySelector(target)) return done();
    // Fetched here and swapped with htmx once the reply is in, into whatever element is the
    // target then: a push or a reply may have redrawn the part (the run's main column) while
    // the fetch was on its way. An htmx request bound to the old element would land in the
    // detached element and look for its out-of-band parts (the effects banner) there.
    fetch(url, {
      credentials: "same-origin",
      headers: { "HX-Request": "true", "HX-Current-URL": window.location.href },
    }).then(function (response) {
      if (!response.ok) throw new Error(String(response.status));
      return response.text();
    }).then(function (html) {
      var live = document.querySelector(target);
      if (!live) return;
      // The person's own confirmation ("Marked as not happened.") came in the reply to
      // their click; the push that the same change sent redraws the part without it. Keep
      // it: a redraw must not take away what a person was just told.
      var told = live.querySelector(":scope > .flash[role='status']");
      htmx.swap(live, html, { swapStyle: "outerHTML" }, { contextElement: document.body });
      var redrawn = document.querySelector(target);
      if (told && redrawn && !redrawn.querySelector(":scope > .flash")) {
        redrawn.insertBefore(told, redrawn.firstChild);
      }
    }).catch(function (error) {
      var text = document.body.dataset.errorText || gettext("That did not work ({}). Reload the page and try again.");
      showProblem(text.replace("{}", error && error.message ? error.message : ""));
    }).then(done, done);
  }
  // Parts that load themselves once drawn (the run page's side-effect report) go through
  // refresh too: one fetch at a time per part, whoever asks.
  htmx.onLoad(function (root) {
    if (!root || !root.querySelectorAll) return;
    var parts = Array.prototype.slice.call(root.querySelectorAll("[data-load-url][id]"));
    if (root.matches && root.matches("[data-load-url][id]")) parts.unshift(root);
    parts.forEach(function (part) { refresh(part.getAttribute("data-load-url"), "#" + part.id); });
  });
  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    var detail = event.detail;
    var target = detail && detail.target;
    var fragment = detail && detail.fragment;
    if (!target || !fragment || !fragment.querySelectorAll) return;
    var incoming = fragment.firstElementChild;
    if (incoming && incoming.hasAttribute("data-refresh-url")) {
      detail.shouldSwap = false;
      refresh(incoming.getAttribute("data-refresh-url"), incoming.getAttribute("data-refresh-target"));
      return;
    }
    if (incoming && incoming.id === target.id && (sameVersion(target, incoming) || busy(target))) {
      detail.shouldSwap = false;
      return;
    }
    var filter = target.getAttribute("data-filter");
    if (filter && incoming && incoming.getAttribute("data-filter") !== filter) {
      detail.shouldSwap = false;
      var link = target.querySelector("a[aria-current][hx-get]");
      if (link) htmx.ajax("GET", link.getAttribute("hx-get"), { source: document.body, target: target, swap: "outerHTML" });
      return;
    }
    fragment.querySelectorAll("[data-version][id]").forEach(function (part) {
      var live = document.getElementById(part.id);
      if (live && (sameVersion(live, part) || busy(live))) part.setAttribute("hx-preserve", "true");
      // An inbox row the person opened stays open when a push redraws it.
      var opened = live && live.querySelector("details.row-details");
      var incomingRow = part.querySelector && part.querySelector("details.row-details");
      if (opened && incomingRow) {
        if (opened.open) incomingRow.setAttribute("open", "");
        else incomingRow.removeAttribute("open");
      }
    });
  });
  document.addEventListener("htmx:oobAfterSwap", tick);
  // Messages follow the state: a note that holds only while the run is in some states
  // ("Cancel accepted…" while cancelling) leaves when the pushed status says otherwise.
  function staleNotes() {
    document.querySelectorAll("[data-while-status][data-run-status]").forEach(function (note) {
      var status = document.getElementById(note.getAttribute("data-run-status"));
      var now = status && status.getAttribute("data-status");
      if (now && note.getAttribute("data-while-status").split(" ").indexOf(now) < 0) note.remove();
    });
  }
  document.addEventListener("htmx:oobAfterSwap", staleNotes);
  // A group holding an open row is open too (after a push redrew the list).
  function openGroups() {
    document.querySelectorAll("details.inbox-group").forEach(function (group) {
      if (group.querySelector("details.row-details[open]")) group.open = true;
    });
  }
  document.addEventListener("htmx:oobAfterSwap", openGroups);
  document.addEventListener("htmx:afterSwap", staleNotes);
  // The server closes a socket with 4401 when the session has ended: show the login page.
  document.addEventListener("htmx:wsClose", function (event) {
    var closed = event.detail && event.detail.event;
    if (closed && closed.code === 4401) window.location.reload();
  });

  // A request htmx could not complete (403, 404, 500, no network): say so, never fail silently.
  function showProblem(text) {
    var main = document.getElementById("main");
    if (!main) return;
    var old = document.getElementById("request-problem");
    if (old) old.remove();
    var note = document.createElement("p");
    note.id = "request-problem";
    note.className = "flash flash-error";
    note.setAttribute("role", "alert");
    note.setAttribute("tabindex", "-1");
    note.textContent = text;
    main.prepend(note);
    note.focus();
  }
  document.addEventListener("htmx:responseError", function (event) {
    var status = event.detail && event.detail.xhr ? event.detail.xhr.status : "";
    var text = document.body.dataset.errorText || gettext("That did not work ({}). Reload the page and try again.");
    showProblem(text.replace("{}", String(status)));
  });
  document.addEventListener("htmx:sendError", function () {
    showProblem(document.body.dataset.offlineText || gettext("Could not reach Holdpoint. Check the connection and try again."));
  });

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", tick);
  } else {
    tick();
  }
  setInterval(tick, 1000);
})();
