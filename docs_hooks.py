"""MkDocs hook: publish bench/results/*.png as results/figures/*.png, so the results pages show
the figures the benchmarks wrote without a second copy of them under docs/."""
import os

from mkdocs.structure.files import File

FIGURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench", "results")


def on_files(files, config):
    for name in sorted(os.listdir(FIGURES)):
        if name.endswith(".png"):
            files.append(File.generated(config, f"results/figures/{name}",
                                        abs_src_path=os.path.join(FIGURES, name)))
    return files
