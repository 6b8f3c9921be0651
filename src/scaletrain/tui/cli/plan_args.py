"""The plan options every front end takes (`scaletrain plan`, the top level, `config write`, `validate`, the wizard
and the plain prompts), as argparse flags; `engine/request/args.py` turns the parsed flags into what the user asks."""

from __future__ import annotations

import argparse

from scaletrain.engine.catalog.hardware import inter_node_gbit_s
from scaletrain.engine.request.args import parse_csv, parse_resident
from scaletrain.engine.vocabulary import (Attention, Generation, MasterWeights, Method, Objective, Offload, Optimizer,
                                          OptimizerImpl, Precision, RefModel, Strategy)


def add_plan_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to train")
    g.add_argument("--model", help="catalog id (scaletrain models), config.json path or folder, or HF cache id")
    g.add_argument("--method", choices=Method.values())
    g.add_argument("--lora-rank", type=int)
    g.add_argument("--lora-targets", type=parse_csv, help="comma list, default all block linears")
    g.add_argument("--base-bits", type=int, choices=[4, 8, 16, 32],
                   help="frozen base for lora/qlora: 4/8 quantized, 16 (bf16, default), 32 (fp32 under autocast)")
    g.add_argument("--weights", metavar="HF_ID|PATH|random-init",
                   help="the weights the run starts from (default: the model's own pretrained weights; random-init "
                        "for config-only models, testing only)")
    g.add_argument("--data", metavar="PATH|HF_DATASET_ID",
                   help="training data: JSONL/JSON/Parquet/CSV file or folder, or an HF dataset id in the local "
                        "cache; its row count is the dataset size unless --dataset-size is given")
    g.add_argument("--resident", action="append", type=parse_resident, default=None, metavar="MODEL[:BITS]",
                   help="an extra inference-only model kept on every GPU (reference policy, evaluator)")
    g = p.add_argument_group("objective (TRL: reward, dpo, grpo)")
    g.add_argument("--objective", choices=Objective.values(),
                   help="sft (default), reward (preference model), dpo or grpo; --micro-batch counts pairs for "
                        "reward/dpo and completions for grpo, as TRL's per_device_train_batch_size")
    g.add_argument("--prompt-len", type=int, help="dpo/grpo: prompt tokens (dpo default: half of --seq-len)")
    g.add_argument("--completion-len", type=int,
                   help="grpo: completion tokens (default 512); the sequence is prompt + completion")
    g.add_argument("--num-generations", type=int, metavar="G", help="grpo: completions per prompt (default 8)")
    g.add_argument("--ref-model", choices=RefModel.values(),
                   help="reference policy: same (frozen copy; LoRA: adapters disabled), none, precomputed (dpo); "
                        "default same for dpo, none for grpo (TRL's beta 0)")
    g.add_argument("--generation", choices=Generation.values(),
                   help="grpo: generate in the training process (train, default), with vLLM colocated (a share of "
                        "the card), or on separate GPUs (server)")
    g.add_argument("--generation-memory", type=float, metavar="F",
                   help="grpo colocate: vLLM's share of the card (default 0.3, TRL's vllm_gpu_memory_utilization)")
    g = p.add_argument_group("hardware")
    g.add_argument("--gpus", help="auto | 4xH200 | 8xRTX4090 | 2x8xH100 (nodes × GPUs per node)")
    g.add_argument("--nodes", type=int)
    g.add_argument("--inter-node-gbps", type=inter_node_gbit_s, metavar="GBPS|LINK",
                   help="inter-node link per node, Gb/s or a name: edr, hdr, ndr, xdr, 10gbe … 400gbe "
                        "(default 200, one HDR InfiniBand port)")
    g = p.add_argument_group("how")
    g.add_argument("--strategy", choices=Strategy.values())
    g.add_argument("--offload", choices=Offload.values())
    g.add_argument("--precision", choices=Precision.values())
    g.add_argument("--master-weights", choices=MasterWeights.values(),
                   help="full fine-tuning: fp32 master weights (mixed precision, default) or bf16 weights only "
                        "(a model loaded in bf16 with AdamW on it, no fp32 copy; DDP or FSDP)")
    g.add_argument("--optimizer", choices=Optimizer.values())
    g.add_argument("--optimizer-impl", choices=OptimizerImpl.values(),
                   help="torch's optimizer implementation (default fused, as the bundled trainer and HF Trainer run)")
    g.add_argument("--attn", choices=Attention.values())
    ck = g.add_mutually_exclusive_group()
    ck.add_argument("--grad-ckpt", dest="grad_ckpt", action="store_true", default=None)
    ck.add_argument("--no-grad-ckpt", dest="grad_ckpt", action="store_false")
    g.add_argument("--headroom", type=float, help="safety fraction of card memory kept free (default 0.10)")
    g = p.add_argument_group("batch and data")
    g.add_argument("--micro-batch", type=int)
    g.add_argument("--grad-accum", type=int)
    g.add_argument("--effective-batch", type=int)
    g.add_argument("--seq-len", type=int)
    g.add_argument("--dataset-size", type=int, help="samples")
    g.add_argument("--epochs", type=float)
    g.add_argument("--tokens-per-sample", type=int)
    g.add_argument("--base-lr", type=float)
    g.add_argument("--base-batch", type=int)
    p.add_argument("--preset", help="start from a preset (scaletrain presets); flags override its fields")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a preset field")
