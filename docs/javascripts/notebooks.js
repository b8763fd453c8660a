// Notebook pages: each exercise's reference solution (a cell tagged "solution", hidden in Jupyter by its
// source_hidden metadata) is folded into a <details> block, closed, so that a reader tries the exercise first.
document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll(".jupyter-wrapper .jp-Cell.celltag_solution").forEach((cell) => {
    if (cell.parentElement.closest(".celltag_solution")) return;   // the template nests a tagged cell in another
    const details = document.createElement("details");
    details.className = "refimpl-solution";
    const summary = document.createElement("summary");
    summary.textContent = "Reference solution (try the exercise first)";
    details.appendChild(summary);
    cell.parentNode.insertBefore(details, cell);
    details.appendChild(cell);
  });
});
