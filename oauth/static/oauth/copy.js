// Copy buttons for the secrets on the token and rotation pages. Without this script the buttons stay hidden and
// the secret is still one click to select (user-select: all).
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  if (!navigator.clipboard) {
    return;
  }
  for (const button of document.querySelectorAll("button.copy-button[data-copy]")) {
    const source = document.getElementById(button.dataset.copy);
    if (!source) {
      continue;
    }
    const label = button.textContent;
    button.hidden = false;
    button.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(source.textContent.trim());
        button.textContent = "Copied";
      } catch (error) {
        button.textContent = "Select and copy by hand";
      }
      setTimeout(() => { button.textContent = label; }, 2000);
    });
  }
});
