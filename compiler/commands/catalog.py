"""`dtc catalog`: the GPUs and model presets dtc knows, with their numbers and sources."""
from __future__ import annotations

import click

from compiler.catalog import load_catalog
from compiler.model import count_params
from compiler.output import table, to_json
from compiler import units


@click.command("catalog")
@click.argument("kind", type=click.Choice(["gpus", "models"]), required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the catalog as JSON.")
def catalog_command(kind: str | None, as_json: bool) -> None:
    """List the catalog's GPUs and model presets (KIND: gpus or models; default both)."""
    cat = load_catalog()
    kinds = [kind] if kind else ["gpus", "models"]
    data: dict = {}
    if "gpus" in kinds:
        data["gpus"] = [
            {"name": g.name, "display_name": g.display_name, "generation": g.generation,
             "peak_flops": dict(g.peak_flops), "hbm_bytes": g.hbm_bytes,
             "hbm_bandwidth_bytes_per_s": g.hbm_bandwidth_bytes_per_s,
             "intra_node_bandwidth_bytes_per_s": g.intra_node_bandwidth_bytes_per_s,
             "inter_node_bandwidth_bytes_per_s": g.inter_node_bandwidth_bytes_per_s,
             "price_per_gpu_hour_usd": g.price_per_gpu_hour_usd, "sources": dict(g.sources)}
            for g in (cat.gpus[n] for n in cat.gpu_names())]
    if "models" in kinds:
        data["models"] = []
        for n in cat.model_names():
            m = cat.models[n]
            pc = count_params(m.shape)
            data["models"].append({"name": m.name, "display_name": m.display_name, "aliases": list(m.aliases),
                                   "params": pc.total, "active_params": pc.active,
                                   "published_params": m.published_params, "shape": m.shape.to_dict(),
                                   "source": m.source})
    if as_json:
        click.echo(to_json(data), nl=False)
        return
    if "gpus" in data:
        click.echo(table(
            ["gpu", "bf16 dense", "fp8 dense", "HBM", "HBM bw", "intra-node", "inter-node", "$/GPU-h"],
            [[g["name"], f"{g['peak_flops'].get('bf16', 0) / 1e12:.0f} TFLOP/s",
              f"{g['peak_flops']['fp8'] / 1e12:.0f} TFLOP/s" if "fp8" in g["peak_flops"] else "-",
              units.format_bytes(g["hbm_bytes"]), f"{g['hbm_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s",
              f"{g['intra_node_bandwidth_bytes_per_s'] / 1e9:.0f} GB/s",
              f"{g['inter_node_bandwidth_bytes_per_s'] * 8 / 1e9:.0f} Gb/s", f"{g['price_per_gpu_hour_usd']:.2f}"]
             for g in data["gpus"]]))
    if "models" in data:
        if "gpus" in data:
            click.echo()
        click.echo(table(
            ["model", "params", "active", "layers", "hidden", "heads/kv", "vocab"],
            [[m["name"], units.format_count(m["params"]), units.format_count(m["active_params"]),
              m["shape"]["num_layers"], m["shape"]["hidden_size"],
              f"{m['shape']['num_attention_heads']}/{m['shape']['num_kv_heads']}", m["shape"]["vocab_size"]]
             for m in data["models"]]))
