// A small markdown renderer for untrusted model text: it builds DOM nodes with
// createElement and textContent only, never innerHTML, so `<script>`, `<img onerror=...>`
// and the like in an answer stay text. Covers what answers use: fenced code blocks,
// headings, lists, block quotes, paragraphs, `code`, **bold**, *italic*, and links
// (http, https and mailto only; opened in a new tab without a referrer).

export function renderMarkdown(text, doc = document) {
  const root = doc.createDocumentFragment();
  const lines = String(text).replace(/\r\n?/g, '\n').split('\n');
  let i = 0;
  const el = (tag, cls) => {
    const e = doc.createElement(tag);
    if (cls) e.className = cls;
    return e;
  };
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*(```|~~~)\s*([\w+#.-]*)/);
    if (fence) {
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trimStart().startsWith(fence[1])) body.push(lines[i++]);
      i++;  // the closing fence (or the end, while an answer is still streaming)
      const pre = el('pre');
      const code = el('code');
      if (fence[2]) code.dataset.lang = fence[2];
      code.textContent = body.join('\n');
      pre.appendChild(code);
      root.appendChild(pre);
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (heading) {
      const h = el('h' + Math.min(6, heading[1].length + 2));  // h3..h6: smaller than the page's own
      appendInline(h, heading[2], doc);
      root.appendChild(h);
      i++;
      continue;
    }
    if (/^\s*>/.test(line)) {
      const quote = [];
      while (i < lines.length && /^\s*>/.test(lines[i])) quote.push(lines[i++].replace(/^\s*>\s?/, ''));
      const bq = el('blockquote');
      bq.appendChild(renderMarkdown(quote.join('\n'), doc));
      root.appendChild(bq);
      continue;
    }
    const item = /^\s*(?:[-*+]|\d+[.)])\s+/;
    if (item.test(line)) {
      const ordered = /^\s*\d/.test(line);
      const list = el(ordered ? 'ol' : 'ul');
      while (i < lines.length && item.test(lines[i])) {
        const li = el('li');
        appendInline(li, lines[i].replace(item, ''), doc);
        list.appendChild(li);
        i++;
      }
      root.appendChild(list);
      continue;
    }
    if (!line.trim()) { i++; continue; }
    const para = [];
    while (i < lines.length && lines[i].trim() && !/^\s*(```|~~~|#{1,6}\s|>)/.test(lines[i]) && !item.test(lines[i]))
      para.push(lines[i++]);
    const p = el('p');
    para.forEach((l, k) => {
      if (k) p.appendChild(doc.createElement('br'));
      appendInline(p, l, doc);
    });
    root.appendChild(p);
  }
  return root;
}

// Inline spans: `code` first (nothing inside it is markup), then links, bold, italic.
// No __bold__: in code-like prose (__init__, __pwned) it matches across words.
const INLINE = /`([^`]+)`|\[([^\]]+)\]\(([^)\s]+)\)|\*\*([^*]+)\*\*|\*([^*\s][^*]*)\*/g;

export function appendInline(parent, text, doc = document) {
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    if (m.index > last) parent.appendChild(doc.createTextNode(text.slice(last, m.index)));
    last = m.index + m[0].length;
    let node;
    if (m[1] !== undefined) {
      node = doc.createElement('code');
      node.textContent = m[1];
    } else if (m[2] !== undefined) {
      if (/^(https?:|mailto:)/i.test(m[3])) {
        node = doc.createElement('a');
        node.href = m[3];
        node.target = '_blank';
        node.rel = 'noopener noreferrer';
        appendInline(node, m[2], doc);
      } else {
        node = doc.createTextNode(m[0]);  // javascript:, data: and the like stay text
      }
    } else {
      node = doc.createElement(m[4] !== undefined ? 'strong' : 'em');
      appendInline(node, m[4] ?? m[5], doc);
    }
    parent.appendChild(node);
  }
  if (last < text.length) parent.appendChild(doc.createTextNode(text.slice(last)));
}
