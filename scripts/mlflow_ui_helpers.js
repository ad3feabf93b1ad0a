// Text search and an on-screen test that a person would agree with: the element is scrolled into view, has a
// size, is not hidden by style, not clipped by an ancestor with overflow (a collapsed description), and the
// topmost element at its centre is it (not a fade-out gradient or a side panel).
window.__fw = window.__fw || {
  norm(s) { return (s || '').replace(/\s+/g, ' ').trim(); },
  deepest(needle, root) {
    root = root || document.body;
    const out = [];
    const walk = (el) => {
      let inChild = false;
      for (const c of el.children) {
        if (this.norm(c.textContent).includes(needle)) { inChild = true; walk(c); }
      }
      if (!inChild) out.push(el);
    };
    if (this.norm(root.textContent).includes(needle)) walk(root);
    return out.filter(e => !['SCRIPT', 'STYLE', 'NOSCRIPT', 'TEMPLATE'].includes(e.tagName));
  },
  onScreen(el) {
    // scroll it into view as a person could: scrollIntoView also scrolls overflow:hidden boxes (a collapsed
    // description), which a person cannot, so those get their scroll position back
    const locked = [];
    for (let a = el.parentElement; a; a = a.parentElement) {
      const s = getComputedStyle(a);
      locked.push([a, /(hidden|clip)/.test(s.overflowY) ? a.scrollTop : null,
                   /(hidden|clip)/.test(s.overflowX) ? a.scrollLeft : null]);
    }
    el.scrollIntoView({block: 'center', inline: 'center'});
    for (const [a, top, left] of locked) {
      if (top !== null) a.scrollTop = top;
      if (left !== null) a.scrollLeft = left;
    }
    const r = el.getBoundingClientRect();
    if (r.width < 1 || r.height < 1) return 'has no size';
    for (let a = el; a && a !== document.documentElement; a = a.parentElement) {
      const s = getComputedStyle(a);
      if (s.display === 'none' || s.visibility === 'hidden' || s.opacity === '0') return 'is hidden by style';
      if (a !== el && (s.overflowX !== 'visible' || s.overflowY !== 'visible')) {
        const ar = a.getBoundingClientRect();
        if (r.bottom <= ar.top + 1 || r.top >= ar.bottom - 1 || r.right <= ar.left + 1 || r.left >= ar.right - 1)
          return 'is clipped (collapsed or scrolled out of a container)';
      }
    }
    const x = Math.min(Math.max(r.left + Math.min(r.width, 40) / 2, 0), innerWidth - 1);
    const y = Math.min(Math.max(r.top + r.height / 2, 0), innerHeight - 1);
    const top = document.elementFromPoint(x, y);
    if (!top) return 'is outside the window';
    if (!(el === top || el.contains(top) || top.contains(el)))
      return 'is covered by <' + top.tagName.toLowerCase() + ' class="' + top.className + '">';
    return 'visible';
  },
  visibleText(needle, scope) {  // scope 'description': only inside the run's description
    const root = scope === 'description' ? this.descriptionBox() : document.body;
    if (!root) return 'not on the page (no description section)';
    const els = this.deepest(needle, root);
    if (!els.length) return 'not on the page';
    let why = '';
    for (const e of els) { why = this.onScreen(e); if (why === 'visible') return why; }
    return why;
  },
  click(selector) { const e = document.querySelector(selector); if (e) e.click(); return !!e; },
  closeAssistant() { return this.click('[data-component-id="mlflow.assistant.chat_panel.close"]'); },
  descriptionBox() {
    const h = [...document.querySelectorAll('h4')].find(e => this.norm(e.textContent).startsWith('Description'));
    return h ? h.parentElement : null;
  },
  rowsCheck(names) {  // a table of the description whose first column names all of `names`
    const box = this.descriptionBox();
    if (!box) return 'not on the page (no description section)';
    const first = t => [...t.querySelectorAll('tr')].map(tr => this.norm(tr.cells[0] && tr.cells[0].textContent));
    const t = [...box.querySelectorAll('table')].find(t => names.every(k => first(t).includes(k)));
    if (!t) return 'not on the page (no table names ' + names.join(', ') + ')';
    const rows = [...t.querySelectorAll('tr')];
    for (const el of [rows[0], rows[rows.length - 1]]) {  // its first and its last row
      const why = this.onScreen(el);
      if (why !== 'visible') return why;
    }
    return 'visible';
  },
  decisionCheck(model, reason) {  // the decision's reason on screen, in the same item as the model's name
    const els = this.deepest(reason, this.descriptionBox() || undefined);
    if (!els.length) return 'not on the page';
    const item = els.map(e => e.closest('li, p, tr') || e).find(e => this.norm(e.textContent).includes(model));
    if (!item) return 'is not beside the model name ' + model;
    return this.onScreen(item);
  },
  pairCheck(a, b) {  // a line or table row of the description with the text `a` and the number `b` (a whole token)
    const box = this.descriptionBox();
    if (!box) return 'not on the page (no description section)';
    const esc = b.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    const re = new RegExp('(^|[^0-9.])' + esc + '($|[^0-9])');
    const blocks = [...box.querySelectorAll('p, li, tr')].filter(e => e.innerText.includes(a) && re.test(e.innerText));
    if (!blocks.length) return 'not on the page';
    let why = '';
    for (const e of blocks) { why = this.onScreen(e); if (why === 'visible') return why; }
    return why;
  },
  blocksCheck() {  // [count, [text, why] of each not on screen] over the description's headings, lines, rows
    const box = this.descriptionBox();
    if (!box) return [0, [['(description)', 'not on the page']]];
    const blocks = [...box.querySelectorAll('h1, h2, h3, h4, h5, h6, p, li, tr')].filter(e => this.norm(e.textContent));
    const bad = blocks.map(e => [this.norm(e.textContent).slice(0, 60), this.onScreen(e)])
      .filter(([, w]) => w !== 'visible');
    return [blocks.length, bad];
  },
  headerCells() { return [...document.querySelectorAll('[role=columnheader], th')]; },
  columnCheck(name) {
    const h = this.headerCells().find(e => this.norm(e.textContent) === name);
    return h ? this.onScreen(h) : 'not on the page';
  },
  cellCheck(text) {  // a table cell whose text starts with `text`
    const cells = [...document.querySelectorAll('[role=cell], td')]
      .filter(c => this.norm(c.textContent).startsWith(text));
    if (!cells.length) return 'not in any cell';
    let why = '';
    for (const c of cells) { why = this.onScreen(c); if (why === 'visible') return why; }
    return why;
  },
  imageCheck(column) {  // a loaded, on-screen <img> under the header `column`
    const h = this.headerCells().find(e => this.norm(e.textContent) === column);
    if (!h) return 'no column ' + column;
    h.scrollIntoView({block: 'nearest', inline: 'center'});
    const hr = h.getBoundingClientRect();
    const imgs = [...document.querySelectorAll('img')].filter(i => {
      const r = i.getBoundingClientRect(); const cx = r.left + r.width / 2;
      return cx >= hr.left && cx <= hr.right && r.top >= hr.bottom - 1;
    });
    if (!imgs.length) return 'no <img> under column ' + column;
    const loaded = imgs.filter(i => i.complete && i.naturalWidth > 0);
    if (!loaded.length) return 'images under column ' + column + ' did not load (' + imgs[0].src + ')';
    for (const i of loaded) { if (this.onScreen(i) === 'visible') return 'visible'; }
    return 'images under column ' + column + ' ' + this.onScreen(loaded[0]);
  },
  clickCell(text) {
    const c = [...document.querySelectorAll('[role=cell], td')].find(c => this.norm(c.textContent).startsWith(text));
    if (c) { c.scrollIntoView({block: 'center', inline: 'center'}); c.click(); }
    return !!c;
  },
  previewCheck(text) {  // `text` in full outside the table (the preview panel a click on a cell opens)
    const els = this.deepest(text).filter(e => !e.closest('[role=cell], td'));
    if (!els.length) return 'not shown in full outside the table';
    let why = '';
    for (const e of els) { why = this.onScreen(e); if (why === 'visible') return why; }
    return why;
  },
  tableReady() { return this.headerCells().length > 0 && document.querySelectorAll('[role=cell], td').length > 0; },
  contentRect() {  // the main pane (right of the sidebar), for screenshots
    const c = document.querySelector('[data-testid="entity-overview-container"]') || document.body;
    let a = c; while (a.parentElement && a.getBoundingClientRect().left > 250) a = a.parentElement;
    const r = a.getBoundingClientRect();
    return {x: r.left, y: r.top, width: r.width, height: r.height};
  },
  scrollers() {
    return [...document.querySelectorAll('*')].filter(e => {
      const s = getComputedStyle(e); return /(auto|scroll)/.test(s.overflowY) && e.scrollHeight > e.clientHeight + 2;
    });
  },
  overflow() { return Math.max(0, ...this.scrollers().map(e => e.scrollHeight - e.clientHeight)); },
  scrollTop() {
    this.scrollers().forEach(e => { e.scrollTop = 0; e.scrollLeft = 0; });
    window.scrollTo(0, 0);
    return true;
  },
  galleryRect() {  // the main pane, down to the last row of the table
    const pane = this.contentRect();
    const bottoms = [...document.querySelectorAll('[role=cell], [role=columnheader]')]
      .map(e => e.getBoundingClientRect().bottom);
    const bottom = Math.max(pane.y + 400, ...bottoms) + 48;
    return {x: pane.x, y: pane.y, width: pane.width, height: Math.min(pane.height, bottom - pane.y)};
  },
  rectOf(selectorText) {
    const box = selectorText === 'description' ? this.descriptionBox() : document.querySelector(selectorText);
    if (!box) return null; const r = box.getBoundingClientRect();
    return {x: r.left, y: r.top, width: r.width, height: r.height};
  },
};
true
