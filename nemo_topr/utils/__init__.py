"""Small utilities every layer may use: output paths, progress lines, argparse types, process groups."""
