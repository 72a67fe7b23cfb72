"""`dtc data prepare`: tokenize text / JSONL / Parquet into Megatron's indexed format (.bin/.idx)."""
from __future__ import annotations

import click

from compiler.output import to_json


@click.group("data")
def data_command() -> None:
    """Prepare training data: one tokenized dataset every target reads."""


@data_command.command("prepare")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--tokenizer", "tokenizer_path", required=True, type=click.Path(),
              help="A Hugging Face tokenizer folder or tokenizer.json, a SentencePiece .model or a tiktoken file.")
@click.option("--output", "-o", "output_prefix", required=True,
              help="Output prefix: writes PREFIX.bin, PREFIX.idx and PREFIX.dtc.json.")
@click.option("--text-key", default="text", show_default=True, help="JSONL field / Parquet column with the text.")
@click.option("--txt-split", type=click.Choice(["paragraph", "line", "file"]), default="paragraph",
              show_default=True, help="How .txt files split into documents.")
@click.option("--eod-token", default=None, help="End-of-document token (default: the tokenizer's EOS).")
@click.option("--no-eod", is_flag=True, help="Do not append the end-of-document token to each document.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def prepare_command(inputs, tokenizer_path, output_prefix, text_key, txt_split, eod_token, no_eod, as_json) -> None:
    """Tokenize INPUTS into PREFIX.bin/.idx (Megatron-LM's indexed format), with a progress bar.

    Megatron reads the result with --data-path PREFIX; the FSDP2 and DeepSpeed trainers read the
    same files; name PREFIX in the spec's data: section.
    """
    from compiler.dataprep import load_tokenizer, prepare

    tokenizer = load_tokenizer(tokenizer_path, eod_token)
    result = prepare(inputs, tokenizer, output_prefix, text_key=text_key, txt_split=txt_split,
                     append_eod=not no_eod, show_progress=not as_json)
    if as_json:
        click.echo(to_json(result.to_dict()), nl=False)
    else:
        click.echo(f"wrote {result.prefix}.bin/.idx: {result.documents:,} documents, {result.tokens:,} tokens "
                   f"({result.dtype}, vocabulary {result.vocab_size:,}, end-of-document id {result.eod_id}); "
                   f"tokenizer {result.tokenizer_kind} {result.tokenizer_path}")
