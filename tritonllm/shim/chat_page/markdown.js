"use strict";
// Markdown to HTML for the model's answers: fenced and inline code, headings, lists, bold, italics and links.
// The source is escaped before any markup is added, so nothing the model writes becomes HTML of its own; an
// unclosed fence (an answer still streaming) renders as code up to where the answer has got.

function escapeHtml(text) {
  return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}

function renderInline(escaped) {
  const spans = [];
  let html = escaped.replace(/`([^`]+)`/g, (_, code) => `\u0000${spans.push(code) - 1}\u0000`);
  html = html
    .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^*\w])\*([^*\s][^*]*?)\*(?!\*)/g, "$1<em>$2</em>")
    .replace(/\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g, '<a href="$2" target="_blank" rel="noopener">$1</a>');
  return html.replace(/\u0000(\d+)\u0000/g, (_, i) => `<code>${spans[Number(i)]}</code>`);
}

function renderMarkdown(source) {
  const lines = escapeHtml(source).split("\n");
  const out = [];
  let paragraph = [];
  let list = null;
  const endParagraph = () => {
    if (paragraph.length) out.push(`<p>${renderInline(paragraph.join("<br>"))}</p>`);
    paragraph = [];
  };
  const endList = () => {
    if (list) out.push(`</${list}>`);
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*```\s*([\w+#.-]*)/);
    if (fence) {
      endParagraph();
      endList();
      const body = [];
      for (i++; i < lines.length && !/^\s*```/.test(lines[i]); i++) body.push(lines[i]);
      out.push(`<pre><code class="language-${fence[1] || "text"}">${body.join("\n")}</code></pre>`);
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (heading) {
      endParagraph();
      endList();
      const level = heading[1].length;
      out.push(`<h${level}>${renderInline(heading[2])}</h${level}>`);
      continue;
    }
    const item = line.match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
    if (item) {
      endParagraph();
      const kind = /\d/.test(item[1]) ? "ol" : "ul";
      if (list !== kind) {
        endList();
        out.push(`<${kind}>`);
        list = kind;
      }
      out.push(`<li>${renderInline(item[2])}</li>`);
      continue;
    }
    if (!line.trim()) {
      endParagraph();
      endList();
      continue;
    }
    endList();
    paragraph.push(line);
  }
  endParagraph();
  endList();
  return out.join("");
}
