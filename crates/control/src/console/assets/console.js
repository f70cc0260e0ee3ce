// The console works without this script; with it, destructive buttons ask first and a new key's
// secret gets a copy button. Loaded from this server only (the CSP allows no inline script).
"use strict";
document.addEventListener("submit", (event) => {
  const question = event.target.getAttribute("data-confirm");
  if (question && !window.confirm(question)) event.preventDefault();
});
for (const button of document.querySelectorAll("button[data-copy]")) {
  const source = document.getElementById(button.getAttribute("data-copy"));
  if (!source || !navigator.clipboard) continue;
  button.hidden = false;
  button.addEventListener("click", () => {
    navigator.clipboard.writeText(source.textContent).then(() => { button.textContent = "Copied"; });
  });
}
