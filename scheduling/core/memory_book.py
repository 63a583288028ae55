"""What the serial scheduler knows of memory when `hardware:` is described: where each model holding memory
sits, what it costs to stop (its measured load time, its recent demand), what protects it, and from that
which models a start must stop (`scheduling.core.placement` does the sums).

Load times are measured here, from the start the scheduler sent to the model's readiness; a model never
loaded yet is taken to load in the mean of the others' times (`UNKNOWN_LOAD_S` while none is known).
GPU memory is measured where the processes run (`nvidia-smi`) and told here: a model found using more than
it declared counts its highest measured figure from then on, so the next placement does not trust a
declaration proven short.

A reload may remove a GPU (or rename it: to the book, the old id is removed and the new one added) while models
run on it. Those models keep it: it stays in the book, *retiring*, shown with them until the last of them stops,
and nothing new is placed on it; what they hold there takes nothing from the GPUs the config now lists. The
scheduler restarts them once idle (`on_retiring`), so they come back on listed GPUs. A reload lowering a running
model's `memory:` is trusted from its next start: until then the book counts what its process was started with.

A decision asks for room several times (is the request blocked, what would it stop, where does it go) while
nothing changes: each answer is kept until the book changes (every change bumps `_version`) or time moves on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from .mentions import listed
from .placement import (
    Demand, Hardware, MemoryNeed, Resident, Room, assign, eviction_cost, fits_at_all, free_memory, make_room,
)
from .ticket import ModelSpec

UNKNOWN_LOAD_S = 30.0


class MemoryBook:
    def __init__(self, hardware: Hardware, specs: Mapping[str, ModelSpec]) -> None:
        self.hardware = hardware
        self._specs = dict(specs)
        self._gpus: dict[str, tuple[str, ...]] = {}  # models holding memory: their GPUs (() on the CPU)
        self._retiring: dict[str, int] = {}  # GPUs a reload removed that models still hold: their MiB
        self._started_at: dict[str, float] = {}
        self._ready_at: dict[str, float] = {}
        self._load_s: dict[str, float] = {}  # the last measured load of each model
        self._leases: dict[str, tuple[str, float]] = {}  # model -> (which lease, "lease #3"; until when)
        self._measured: dict[str, dict[str, int]] = {}  # models holding memory: their latest use, MiB by GPU
        self._highest: dict[str, int] = {}  # a model's highest use on one GPU, where above its declaration
        self._overcommitted: set[str] = set()  # GPUs whose models are measured using more than they have
        self._held: dict[str, int] = {}  # a running process's MiB per GPU under a declaration a reload lowered
        self._demand = Demand()
        self._now = 0.0
        self._version = 0  # bumped by every change that room() reads
        self._kept_at: tuple[int, float] = (-1, 0.0)  # (version, now) the kept facts and rooms hold for
        self._facts: dict[str, tuple[int, float, str]] = {}  # model -> (MiB counted, cost, protection)
        self._rooms: dict[tuple, Room | None] = {}

    def _changed(self) -> None:
        self._version += 1

    def reconfigure(self, specs: Mapping[str, ModelSpec], hardware: Hardware, holding: Iterable[str]) -> None:
        """A reload: models running on before it keep their GPUs; one of `holding` placed nowhere yet (it started
        before `hardware:` was described) counts where it would go now, or on the CPU when it fits nowhere. A model a
        start under way stops is not `holding`: that start took its memory when it was sent."""
        counted = {m: self.need(m).mib for m in self._gpus if m in self._specs}
        for model in [m for m in self._highest if m not in specs or specs[m].memory != self._specs[m].memory]:
            del self._highest[model]  # a new declaration (or none) is trusted again until measured
        self._specs = dict(specs)
        for model, mib in counted.items():
            if model in specs and self.need(model).mib < mib:
                self._held[model] = mib  # the process started under the old declaration holds it until it stops
        known = {**self._retiring, **self.hardware.gpus}
        self._retiring = {gpu: mib for gpu, mib in known.items() if gpu not in hardware.gpus}
        self.hardware = hardware
        self._forget_empty_retiring()
        self._changed()
        for model in holding:
            if model not in self._gpus and model in self._specs:
                residents = [Resident(m, gpus, self.need(m).mib) for m, on in self._gpus.items()
                             if m in self._specs and (gpus := self._placeable(on)) is not None]
                self._gpus[model] = assign(hardware, self.need(model), residents) or ()

    def on_retiring(self) -> list[str]:
        """The models holding a GPU a reload removed."""
        return sorted(m for m, gpus in self._gpus.items() if any(gpu in self._retiring for gpu in gpus))

    def _placeable(self, gpus: tuple[str, ...]) -> tuple[str, ...] | None:
        """Of a model's `gpus`, those the config lists; None when it is on retiring GPUs alone (its memory there
        is none placement gives out, and stopping it frees none)."""
        if not gpus:
            return ()
        listed = tuple(gpu for gpu in gpus if gpu in self.hardware.gpus)
        return listed or None

    def _forget_empty_retiring(self) -> None:
        held = {gpu for gpus in self._gpus.values() for gpu in gpus}
        self._retiring = {gpu: mib for gpu, mib in self._retiring.items() if gpu in held}

    def need(self, model: str) -> MemoryNeed:
        """What placement counts for `model`: its declaration, or its highest measured use where that is more, or
        what its running process was started with before a reload lowered its declaration."""
        declared = self.declared(model)
        return replace(declared, mib=max(declared.mib, self._highest.get(model, 0), self._held.get(model, 0)))

    def declared(self, model: str) -> MemoryNeed:
        return self._specs[model].memory or MemoryNeed(0, 0)

    def never_fits(self, model: str) -> str | None:
        """Why `model` could not start even with nothing else loaded (its measured use is more than the hardware
        holds, or a reload's hardware no longer holds its declaration), or None: no wait would help."""
        need = self.need(model)
        if fits_at_all(self.hardware, need):
            return None
        declared = self.declared(model).mib
        why = (f"measured with nvidia-smi (it declared {declared} MiB)" if need.mib > declared
               else "as it declared (memory:)")
        if need.gpus == 0:
            return (f"model {model!r} needs {need.mib} MiB of the CPU's memory, {why}, more than hardware.cpu.memory "
                    f"({self.hardware.cpu_mib} MiB), so it can never start here")
        largest = max(self.hardware.gpus, key=self.hardware.gpus.__getitem__)
        on = "on a GPU" if need.gpus == 1 else f"on each of {need.gpus} GPUs"
        return (f"model {model!r} needs {need.mib} MiB {on}, {why}, more than the hardware holds (the largest GPU, "
                f"{largest}, has {self.hardware.gpus[largest]} MiB), so it can never start here — raise the GPUs' "
                "memory under hardware.gpus if it is understated, or make the model use less (its context size), "
                "then reload")

    # -- what happens -------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Time moves on (a minResidency may have ended)."""
        self._now = max(self._now, now)

    def arrived(self, model: str, priority: int, now: float) -> None:
        self._now = max(self._now, now)
        self._demand.arrived(model, priority, now)
        self._changed()

    def starting(self, model: str, gpus: tuple[str, ...], now: float) -> None:
        self._now = max(self._now, now)
        self._gpus[model] = gpus
        self._started_at[model] = now
        self._ready_at.pop(model, None)
        self._changed()

    def ready(self, model: str, now: float) -> None:
        self._now = max(self._now, now)
        started = self._started_at.pop(model, None)
        if started is not None:
            self._load_s[model] = now - started
        self._ready_at[model] = now
        self._changed()

    def measured(self, model: str, use: Mapping[str, int]) -> str | None:
        """What the processes of `model` (holding memory on GPUs) use now: MiB by GPU id. Returns a warning
        when this is the first time, or a higher time, that it uses more on one GPU than it declared."""
        if model not in self._gpus or model not in self._specs or not self.declared(model).gpus:
            return None  # stopped since it was measured, or on the CPU, whose memory nvidia-smi does not see
        self._measured[model] = dict(use)
        told = [why for why in (self._above_declaration(model, use), self._overcommit()) if why]
        return "; ".join(told) or None

    def _above_declaration(self, model: str, use: Mapping[str, int]) -> str | None:
        highest, declared = max(use.values(), default=0), self.declared(model).mib
        if highest <= max(declared, self._highest.get(model, 0)):
            return None
        self._highest[model] = highest
        self._changed()
        return (f"model {model} uses {highest} MiB of GPU memory, more than the {declared} MiB it declared "
                f"(memory:); placement counts {highest} MiB for it from now on")

    def _overcommit(self) -> str | None:
        """GPUs whose models are measured using more than the GPU has, told when they become so (once each)."""
        over = {gpu for gpu, mib in self.hardware.gpus.items() if (self._measured_on(gpu) or 0) > mib}
        new, self._overcommitted = sorted(over - self._overcommitted), over
        if not new:
            return None
        return "; ".join(f"GPU {gpu}'s models are measured using {self._measured_on(gpu)} MiB, more than its "
                         f"{self.hardware.gpus[gpu]} MiB (hardware.gpus): its memory is overcommitted" for gpu in new)

    def gone(self, model: str) -> None:
        """Stopped, failed to start, or evicted by a start (which counts it stopped at once)."""
        self._gpus.pop(model, None)
        self._held.pop(model, None)
        self._measured.pop(model, None)
        self._overcommitted = {gpu for gpu in self._overcommitted if (self._measured_on(gpu) or 0) > self.hardware.gpus[gpu]}
        self._started_at.pop(model, None)
        self._ready_at.pop(model, None)
        self._forget_empty_retiring()
        self._changed()

    def lease(self, model: str, why: str | None, until: float = float("inf")) -> None:
        """Protect `model` from being stopped to make room, and from its TTL, until `until` (why None: no longer)."""
        if why is None:
            self._leases.pop(model, None)
        else:
            self._leases[model] = (why, until)
        self._changed()

    def set_leases(self, leases: Mapping[str, tuple[str, float]]) -> None:
        """The leases in force now, replacing those before (each model's longest, by the caller)."""
        self._leases = dict(leases)
        self._changed()

    def leased(self, model: str, now: float | None = None) -> bool:
        lease = self._leases.get(model)
        return lease is not None and (self._now if now is None else now) < lease[1]

    # -- what follows -------------------------------------------------------------------------

    def gpus_of(self, model: str) -> tuple[str, ...] | None:
        return self._gpus.get(model)

    def placed(self) -> dict[str, tuple[str, ...]]:
        return dict(self._gpus)

    def load_s(self, model: str) -> float:
        if model in self._load_s:
            return self._load_s[model]
        known = list(self._load_s.values())
        return sum(known) / len(known) if known else UNKNOWN_LOAD_S

    def cost(self, model: str, now: float | None = None) -> float:
        return eviction_cost(self.load_s(model), self._demand.per_minute(model, self._now if now is None else now))

    def made_room(self, stopped: tuple[str, ...], gpus: tuple[str, ...], now: float) -> str:
        """What a decision says of the models a start stops for their memory: each one's cost, with the
        formula's terms, as they stood when the set was chosen."""
        def priced(model: str) -> str:
            load_s, demand = self.load_s(model), self._demand.per_minute(model, now)
            return (f"{model} (cost {eviction_cost(load_s, demand):.2f} = {load_s:.1f} s load × "
                    f"(1 − e^−{demand:.2f}))")

        where = (f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {', '.join(gpus)}") if gpus else "the CPU"
        return (f"to make room on {where} its start stopped {listed((m, priced(m)) for m in stopped)}: the idle "
                "models whose stop frees enough at least cost, cost = load seconds × (1 − e^−demand), demand = "
                "Σ 2^(priority/100) of the model's requests per minute over the last 10 minutes")

    def protection(self, model: str, now: float | None = None) -> str:
        """Why `model` may not be stopped to make room, or ""."""
        now = self._now if now is None else now
        spec = self._specs.get(model)
        if spec is not None and spec.pinned:
            return "pinned"
        if self.leased(model, now):
            return self._leases[model][0]
        ready_at = self._ready_at.get(model)
        if spec is not None and ready_at is not None and now < ready_at + spec.min_residency:
            return f"minResidency for {ready_at + spec.min_residency - now:.0f} s more"
        return ""

    def next_deadline(self) -> float | None:
        """When a model's minResidency or lease ends (a request it blocked may then go)."""
        ends = [at + self._specs[m].min_residency for m, at in self._ready_at.items()
                if m in self._specs and self._specs[m].min_residency > 0 and at + self._specs[m].min_residency > self._now]
        ends += [until for _, until in self._leases.values() if self._now < until < float("inf")]
        return min(ends, default=None)

    def room(self, target: str, holding: Iterable[str], busy: Callable[[str], bool],
             leaving: Iterable[str] = (), planned: Mapping[str, tuple[str, ...]] | None = None) -> Room | None:
        """How `target` gets its memory beside `holding` (models holding memory or about to), of which
        `leaving` stop anyway (free to take, at no cost); `planned` places models not started yet (busy
        from then on). None: it never fits (a config error)."""
        leaving, planned = frozenset(leaving), planned or {}
        if self._kept_at != (self._version, self._now):
            self._kept_at, self._facts, self._rooms = (self._version, self._now), {}, {}
        placed = {**self._gpus, **planned} if planned else self._gpus
        models = tuple(m for m in dict.fromkeys(holding) if m != target and m in placed and m in self._specs)
        key = (target, models, tuple(busy(m) for m in models), leaving, tuple(sorted(planned.items())))
        if key not in self._rooms:
            self._rooms[key] = self._room(target, models, key[2], leaving, planned, placed)
        return self._rooms[key]

    def _room(self, target: str, models: tuple[str, ...], busy: tuple[bool, ...], leaving: frozenset[str],
              planned: Mapping[str, tuple[str, ...]], placed: Mapping[str, tuple[str, ...]]) -> Room | None:
        """`room`, worked out."""
        if protected := sorted(m for m in leaving if self.protection(m)):  # the groups or matrix would stop them
            return Room(blocked_by=tuple(protected))
        residents = []
        for model, is_busy in zip(models, busy, strict=True):
            gpus = self._placeable(placed[model])
            if gpus is None:
                continue
            mib, cost, protection = self._facts_of(model)
            stops = model in leaving
            residents.append(Resident(model, gpus, mib, cost=0.0 if stops else cost,
                                      busy=(is_busy or model in planned) and not stops,
                                      protected="" if stops else protection))
        return make_room(self.hardware, self.need(target), residents)

    def _facts_of(self, model: str) -> tuple[int, float, str]:
        """What placement counts for `model` now: (MiB, cost, protection), kept while nothing changes."""
        if model not in self._facts:
            self._facts[model] = (self.need(model).mib, self.cost(model), self.protection(model))
        return self._facts[model]

    def view(self, busy: Callable[[str], bool]) -> dict:
        """Each GPU's memory, what the models on it declared, what placement counts for them, what they use
        (measured; None until measured), those models, and whether a reload removed it (`retiring`); the CPU's
        likewise (for `/api/placement`)."""
        placed = {m: gpus for m, gpus in self._gpus.items() if m in self._specs}
        residents = [Resident(m, gpus, self.need(m).mib) for m, gpus in placed.items()]
        shown = Hardware({**self.hardware.gpus, **self._retiring}, self.hardware.cpu_mib)
        free, cpu_free = free_memory(shown, residents)
        gpus = []
        for gpu, mib in shown.gpus.items():
            on_it = sorted(m for m, on in placed.items() if gpu in on)
            gpus.append({"id": gpu, "memory_mib": mib, "declared_mib": sum(self.declared(m).mib for m in on_it),
                         "counted_mib": mib - free[gpu], "measured_mib": self._measured_on(gpu), "models": on_it,
                         "retiring": gpu in self._retiring, "overcommitted": gpu in self._overcommitted})
        on_cpu = sorted(m for m, on in placed.items() if not on)
        cpu = {"memory_mib": self.hardware.cpu_mib,
               "declared_mib": sum(self.declared(m).mib for m in on_cpu), "models": on_cpu}
        models = {m: {"gpus": list(on), "declared_mib": self.declared(m).mib, "counted_mib": self.need(m).mib,
                      "measured_mib": max(self._measured[m].values(), default=0) if m in self._measured else None,
                      "measured_per_gpu_mib": dict(self._measured[m]) if m in self._measured else None, "busy": busy(m),
                      "protected": self.protection(m) or None, "load_s": round(self.load_s(m), 3),
                      "eviction_cost": round(self.cost(m), 3)} for m, on in sorted(placed.items())}
        return {"gpus": gpus, "cpu": cpu, "models": models}

    def _measured_on(self, gpu: str) -> int | None:
        """What the models holding memory use on `gpu`, measured (None: none of them measured there)."""
        uses = [use[gpu] for use in self._measured.values() if gpu in use]
        return sum(uses) if uses else None

    def room_with(self, model: str, holding: Iterable[str], busy: Callable[[str], bool],
                  leaving: frozenset[str]) -> Room | None:
        """`room`, with `leaving` (what the groups or matrix stop for `model`) among what it stops."""
        room = self.room(model, holding, busy, leaving)
        return room if room is None or room.blocked_by else replace(room, evict=room.evict | leaving)

    def blocked(self, model: str, holding: Iterable[str], busy: Callable[[str], bool],
                leaving: Iterable[str] = ()) -> str | None:
        """Why `model` cannot start however long it waits for busy work: the protected models in its way (its
        memory's, or `leaving`'s: those the groups or matrix would stop)."""
        room = self.room(model, holding, busy, leaving)
        if room is None or not room.blocked_by:
            return None
        protections = listed((m, f"{m} ({self.protection(m)})") for m in room.blocked_by)
        verb = "is" if len(room.blocked_by) == 1 else "are"
        return f"model {model} has room only if {protections} {verb} stopped, which is never done to make room"

    def leaves_room(self, model: str, leaving: Iterable[str], target: str, target_leaving: frozenset[str],
                    up: Iterable[str], busy: Callable[[str], bool]) -> bool:
        """Whether starting `model` (stopping `leaving`) leaves the better swap to `target` (which stops
        `target_leaving` anyway) as much room as before: it stops nothing, and takes no memory the swap needs."""
        up = tuple(up)
        own = self.room(model, tuple(m for m in up if m != model), busy, leaving)
        if own is None or own.blocked_by or own.evict:
            return own is None  # one that stops models may stop what the swap counts on
        others = tuple(m for m in (*up, model) if m != target)
        before = self.room(target, tuple(m for m in up if m != target), busy, target_leaving)
        after = self.room(target, others, busy, target_leaving, planned={model: own.gpus})
        return before is not None and after is not None and not after.blocked_by and after.evict <= before.evict
