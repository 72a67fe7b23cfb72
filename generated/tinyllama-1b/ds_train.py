"""DeepSpeed entry for tinyllama-1b (layout t1_p1_d16_z2_mbs16_ga4_nore): torchrun|deepspeed ... ds_train.py [--steps N]; runs dtc_runtime/deepspeed_train.py with ds_train_config.json and ds_config.json (all beside this file)."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from dtc_runtime.common import finish  # noqa: E402
from dtc_runtime.deepspeed_train import main  # noqa: E402

if __name__ == "__main__":
    argv = sys.argv[1:] if "--config" in sys.argv[1:] else ["--config", str(HERE / "ds_train_config.json"), *sys.argv[1:]]
    finish(main(argv))
