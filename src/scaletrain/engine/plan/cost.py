"""What a run costs: the plan's GPUs × an on-demand price per GPU-hour × its predicted time.

The prices: the bundled table (engine/catalog/prices.yaml: per catalog GPU, with its source and the date it was
known on), then the user's file ($SCALETRAIN_CONFIG_DIR, else $XDG_CONFIG_HOME/scaletrain, else
~/.config/scaletrain: prices.yaml, the same format; its rows replace the bundled ones), then `--gpu-price` for the
plan's own GPU. The file is safe YAML with limits (engine/yamlsafe.py), read bounded, never executed; anything
wrong in it is one line naming the file and what is accepted.

    cost = price per GPU-hour × GPUs (nodes × GPUs per node) × predicted seconds ÷ 3600

The time is the plan's (plan.time.total_seconds: the steps of its epochs over --dataset-size); without a dataset
size the total is unknown and the cost per hour and per optimizer step still are.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.request.fields import GPU_PRICE_FLAG, MAX_GPU_PRICE

PRICES_FILE = "prices.yaml"
BUNDLED_PRICES = Path(__file__).resolve().parents[1] / "catalog" / PRICES_FILE
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class Price:
    per_gpu_hour: float
    currency: str
    source: str                   # where the number comes from, with its date


@dataclass(frozen=True)
class PriceTable:
    """Catalog GPU key → its price."""

    prices: Mapping[str, Price]

    def price(self, gpu_key: str) -> Price | None:
        return self.prices.get(gpu_key)

    def with_price(self, gpu_key: str, price: Price) -> "PriceTable":
        return PriceTable({**self.prices, gpu_key: price})


@dataclass(frozen=True)
class RunCost:
    """One plan's (or one `--table gpus` row's) cost; the money fields are None without a price."""

    gpu: str                      # the catalog key the price is for
    gpus: int
    price: Price | None
    seconds: float | None         # predicted run time (None: unknown without a dataset size)
    step_seconds: float | None

    @property
    def per_hour(self) -> float | None:
        return None if self.price is None else self.price.per_gpu_hour * self.gpus

    @property
    def total(self) -> float | None:
        ph = self.per_hour
        return None if ph is None or self.seconds is None else ph * self.seconds / SECONDS_PER_HOUR

    @property
    def per_step(self) -> float | None:
        ph = self.per_hour
        return None if ph is None or self.step_seconds is None else ph * self.step_seconds / SECONDS_PER_HOUR

    def to_json(self) -> dict[str, Any]:
        p = self.price
        return {"currency": p.currency if p else None, "per_gpu_hour": p.per_gpu_hour if p else None,
                "gpus": self.gpus, "per_hour": self.per_hour, "per_step": self.per_step,
                "hours": None if self.seconds is None else self.seconds / SECONDS_PER_HOUR, "total": self.total,
                "price_source": p.source if p else NO_PRICE}

    def line(self) -> str:
        """'cost: 16 GPUs × 0.69 USD/GPU-h = 11.04 USD/h; total 123.45 USD over 11.2 h (source: …)'."""
        p = self.price
        if p is None:
            return f"cost: no price for {self.gpu}: {NO_PRICE_HOW}"
        head = f"cost: {self.gpus} GPU{'s' if self.gpus != 1 else ''} × {money(p.per_gpu_hour)} {p.currency}/GPU-h = " \
               f"{money(self.per_hour)} {p.currency}/h"
        if self.total is not None and self.seconds is not None:
            tail = f"; total {money(self.total)} {p.currency} over {self.seconds / SECONDS_PER_HOUR:,.1f} h"
        elif self.per_step is not None:
            tail = f"; {money(self.per_step)} {p.currency} per optimizer step (total: give --dataset-size)"
        else:
            tail = ""
        return f"{head}{tail} (price: {p.source})"


NO_PRICE_HOW = f"give {GPU_PRICE_FLAG} USD_PER_GPU_HOUR or a row in prices.yaml"
NO_PRICE = f"no price for this GPU: {NO_PRICE_HOW}"


def money(x: float | None) -> str:
    """An amount for text: two decimals, thousands separators; four significant digits under 0.01."""
    if x is None:
        return "?"
    return f"{x:,.2f}" if x >= 0.01 or x == 0 else f"{x:.2g}"


# ---- the tables ---------------------------------------------------------------------------------------------------
def user_prices_path() -> Path:
    """The user's price file: $SCALETRAIN_CONFIG_DIR/prices.yaml, else $XDG_CONFIG_HOME/scaletrain/prices.yaml,
    else ~/.config/scaletrain/prices.yaml (where the calibration profiles live too)."""
    if os.environ.get("SCALETRAIN_CONFIG_DIR"):
        return Path(os.environ["SCALETRAIN_CONFIG_DIR"]) / PRICES_FILE
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "scaletrain" / PRICES_FILE


def _parse_table(doc: Any, where: str, bundled: bool) -> dict[str, Price]:
    """A prices.yaml document → catalog key → Price; one ScaletrainError line on anything else."""
    from scaletrain.engine.catalog.hardware import find_gpu

    form = ("accepted: a mapping with 'prices:' (GPU name: a price per GPU-hour, or {per_gpu_hour: N, source: TEXT})"
            " and optionally 'currency:' (e.g. USD) and 'source:'")
    if not isinstance(doc, dict) or not isinstance(doc.get("prices"), dict):
        raise ScaletrainError(f"{where}: no 'prices:' mapping; {form}")
    unknown = sorted(str(k) for k in doc if k not in ("currency", "source", "as_of", "prices"))
    if unknown:
        raise ScaletrainError(f"{where}: unknown key {unknown[0]!r}; {form}")
    currency = doc.get("currency", "USD")
    if not (isinstance(currency, str) and currency.isalpha() and 1 <= len(currency) <= 8):
        raise ScaletrainError(f"{where}: currency {str(currency)[:20]!r} is not a currency code; e.g. USD or EUR")
    source = str(doc.get("source") or "bundled table")
    out: dict[str, Price] = {}
    for name, entry in doc["prices"].items():
        value, said = entry, None
        if isinstance(entry, dict):
            extra = sorted(str(k) for k in entry if k not in ("per_gpu_hour", "source"))
            if extra:
                raise ScaletrainError(f"{where}: {name}: unknown key {extra[0]!r}; {form}")
            value, said = entry.get("per_gpu_hour"), entry.get("source")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and 0 < value <= MAX_GPU_PRICE):
            raise ScaletrainError(f"{where}: {name}: price {str(value)[:20]!r} is not accepted; give a number more "
                                  f"than 0 and at most {MAX_GPU_PRICE:,.0f} per GPU-hour")
        try:
            key = find_gpu(str(name)).key
        except ScaletrainError as e:
            raise ScaletrainError(f"{where}: {e}") from None
        if bundled:
            row_source = f"{said or source}, as known on {doc.get('as_of')}"
        else:
            row_source = f"{said} ({where})" if said else where
        out[key] = Price(float(value), currency.upper(), row_source)
    return out


def bundled_prices() -> PriceTable:
    """The table shipped with scaletrain (engine/catalog/prices.yaml)."""
    return PriceTable(_parse_table(_bundled_document(), "bundled prices.yaml", bundled=True))


@functools.lru_cache(maxsize=1)
def _bundled_document() -> Any:
    """The shipped file, parsed once per process by libyaml where PyYAML has it (our own file: no limits needed;
    PyYAML's pure-Python loader took 7 ms a parse here, libyaml 0.7 ms)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(BUNDLED_PRICES.read_text(encoding="utf-8"), Loader=loader)   # noqa: S506 (a safe loader)


def read_user_prices(path: Path) -> dict[str, Price]:
    """The user's price file's rows (none when the file is absent); one line on a file that is not right."""
    import yaml

    from scaletrain.engine.fileio import read_text_bounded
    from scaletrain.engine.yamlsafe import YamlLimitError, load_yaml

    if not os.path.lexists(path):
        return {}
    try:
        text = read_text_bounded(path, what="price file")
        doc = load_yaml(text)
    except OSError as e:
        raise ScaletrainError(f"cannot read the price file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ScaletrainError(f"the price file {path} is not UTF-8 text") from None
    except yaml.YAMLError as e:
        raise ScaletrainError(f"the price file {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    except YamlLimitError as e:
        raise ScaletrainError(f"the price file {path} is refused: {e}") from None
    return _parse_table(doc, str(path), bundled=False)


def price_table(gpu_key: str | None = None, gpu_price: float | None = None,
                user_file: Path | None = None) -> PriceTable:
    """Bundled prices, the user's file over them, then --gpu-price for `gpu_key` (the plan's GPU)."""
    table = bundled_prices()
    user = read_user_prices(user_file if user_file is not None else user_prices_path())
    if user:
        table = PriceTable({**table.prices, **user})
    if gpu_price is not None and gpu_key is not None:
        table = table.with_price(gpu_key, Price(float(gpu_price), "USD", GPU_PRICE_FLAG))
    return table


# ---- costs --------------------------------------------------------------------------------------------------------
def hardware_cost(gpu_key: str, gpus: int, seconds: float | None, step_seconds: float | None,
                  table: PriceTable) -> RunCost:
    return RunCost(gpu=gpu_key, gpus=gpus, price=table.price(gpu_key), seconds=seconds, step_seconds=step_seconds)


def plan_cost(plan: Any, table: PriceTable) -> RunCost:
    """The plan's cost: its GPUs for its predicted total time (per hour and per step when that is unknown)."""
    hw = plan.setup.hardware
    t = plan.time
    return hardware_cost(hw.gpu.key, hw.world_size, t.total_seconds if t else None, t.step_seconds if t else None,
                         table)

