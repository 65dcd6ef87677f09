"""
pipeweave's schedule and analysis layers: generate, prove, lower, simulate and synthesize pipeline-parallel schedules, and read and write PyTorch's pipelining CSV.
"""

from collections.abc import Sequence
import os


class Error(Exception):
    pass

class Program:
    """
    Every device's ordered compute actions and the shape they were made for.

    >>> p = pipeweave.schedule('1f1b', 2, 1, 2)
    >>> p.actions
    [['0F0', '0F1', '0B0', '0B1'], ['1F0', '1B0', '1F1', '1B1']]
    """

    @property
    def kind(self) -> str:
        """
        The generator's name ('1f1b', 'interleaved', ...), 'auto' when synthesized, 'custom' when hand-written or read from a CSV.
        """

    @property
    def devices(self) -> int:
        """Pipeline devices P."""

    @property
    def chunks(self) -> int:
        """Model chunks per device V."""

    @property
    def micro_batches(self) -> int:
        """Micro-batches M."""

    @property
    def stages(self) -> int:
        """Virtual stages P * V."""

    @property
    def placement(self) -> str:
        """
        Where the stages sit: 'loop' (stage s on device s mod P) or 'v' (down the devices and back up).
        """

    @property
    def actions(self) -> list[list[str]]:
        """
        Each device's actions as PyTorch's action strings ('0F3', '5I2', '(0F6;4B0)OVERLAP_F_B', '3REDUCE_GRAD'), one per step; raises Error for an action PyTorch has not (a recomputation, an offload): str(program) spells every action.
        """

    def device_of_stage(self, stage: int) -> int:
        """
        The device (rank) that holds virtual stage `stage` under the program's placement.
        """

    def __str__(self) -> str: ...

    def __repr__(self) -> str: ...

    def __eq__(self, arg: Program, /) -> bool: ...

    __hash__: None = None

class Verification:
    """
    The proof's outcome: true when the program cannot deadlock, runs every action once after what it reads, and keeps what its memory rules say; otherwise the first violation, where it is.
    """

    @property
    def ok(self) -> bool: ...

    @property
    def device(self) -> int:
        """The device of the violation, -1 when it belongs to none."""

    @property
    def step(self) -> int:
        """The step of the violation, -1 when it belongs to none."""

    @property
    def message(self) -> str:
        """'ok', or what is wrong."""

    def __bool__(self) -> bool: ...

    def __str__(self) -> str: ...

    def __repr__(self) -> str: ...

class Lowered:
    """
    A lowered program: each device's steps, a group of sends and receives and then at most one compute action, in the order the runtime issues them.
    """

    @property
    def steps(self) -> list[list[str]]:
        """Each device's steps as text: '[recv act s0 m1 <- d0] F1.1'."""

    def __str__(self) -> str: ...

class Costs:
    """
    What each action and each transfer costs in the simulator, and how it replays.

    >>> pipeweave.Costs(forward=1, input=1, weight=0.5, p2p_latency=0.1)
    <pipeweave.Costs F 1, I 1, W 0.5, B 1.5>
    """

    def __init__(self, *, forward: float = 1.0, backward: float | None = None, input: float | None = None, weight: float | None = None, stages: Sequence[tuple[float, float, float]] | None = None, p2p_latency: float = 0.0, p2p_bandwidth: float = 0.0, activation_bytes: float = 0.0, device_speed: Sequence[float] | None = None, overlap_efficiency: float = 0.0, reduce: float = 0.0, copy_bandwidth: float = 0.0, stash_sizes: Sequence[tuple[float, float, float]] | None = None, replay: str = 'steps') -> None:
        """
        forward: a chunk's forward F; input, weight: the halves I and W of a split backward (default: F each); backward: a whole backward B (default I + W); stages: one (F, I, W) per virtual stage in place of those; p2p_latency, p2p_bandwidth (0: unlimited), activation_bytes: each transfer; device_speed: one factor per device that divides its compute times; overlap_efficiency: how much of an overlapped pair's shorter half is hidden, 0..1; reduce: a chunk's gradient all-reduce R; copy_bandwidth: the copy lane's, in stash units per time unit (0: unlimited); stash_sizes: (stash, input, gradient) for every stage, or one per virtual stage (default (1, 0.125, 1): one activation); replay: 'steps' (the lowered steps under rendezvous) or 'dataflow' (the bound of the program order).
        """

    @property
    def forward(self) -> float: ...

    @property
    def backward(self) -> float: ...

    @property
    def input(self) -> float: ...

    @property
    def weight(self) -> float: ...

    @property
    def stages(self) -> list[tuple[float, float, float]]:
        """
        One (F, I, W) per virtual stage; empty when every stage costs the same.
        """

    @property
    def p2p_latency(self) -> float: ...

    @property
    def overlap_efficiency(self) -> float: ...

    @property
    def reduce(self) -> float: ...

    @property
    def copy_bandwidth(self) -> float: ...

    @property
    def replay(self) -> str: ...

    def __repr__(self) -> str: ...

class Event:
    """One action of a run: its device, step, stage and times."""

    @property
    def device(self) -> int: ...

    @property
    def step(self) -> int:
        """The step of the device's lowered program."""

    @property
    def stage(self) -> int:
        """The virtual stage."""

    @property
    def phase(self) -> str:
        """
        F, B, I, W, C (a recomputation), R (a gradient reduction), O or L (an offload or reload).
        """

    @property
    def micro_batch(self) -> int: ...

    @property
    def start(self) -> float: ...

    @property
    def end(self) -> float: ...

    def __repr__(self) -> str: ...

class Trace:
    """
    A run of a schedule, simulated: each device's actions with their times, and the most each device kept at once.
    """

    @property
    def makespan(self) -> float: ...

    @property
    def bubble_ratio(self) -> float:
        """
        (makespan - the busiest device's busy time) / that busy time: Megatron-LM's (P - 1) / M for 1F1B at its default costs.
        """

    @property
    def peak_activations(self) -> list[int]:
        """Per device: forward stashes kept at once, at most."""

    @property
    def peak_memory(self) -> list[float]:
        """
        Per device: stashes and the gradients kept for a W, at most, in the stash sizes' unit.
        """

    @property
    def events(self) -> list[Event]:
        """
        Every action as it ran: the compute lanes', then the gradient reductions' and the copies', device by device.
        """

    def ascii(self, width: int = 160) -> str:
        """
        The timeline as text, one line per device (width: the most columns of a line).
        """

    def svg(self, *, width: int = 1200, row_height: int = 34, title: str = '', subtitle: str = '', time_span: float = 0.0) -> str:
        """
        The timeline as an SVG picture; time_span: the time its width stands for (pictures drawn with one span share a scale).
        """

    def chrome_trace(self, name: str = '') -> str:
        """The run as Chrome trace JSON (Perfetto, chrome://tracing)."""

    def summary(self) -> str:
        """Makespan, bubble ratio and each device's busy time and peaks, as text."""

    def to_csv(self) -> str:
        """The actions in the order they ran, in PyTorch's CSV format."""

class Synthesis:
    """A synthesized program and what the search knows of it."""

    @property
    def program(self) -> Program:
        """The fastest program found; it verifies and fits the memory limit."""

    @property
    def makespan(self) -> float:
        """Its simulated makespan under the costs."""

    @property
    def lower_bound(self) -> float:
        """No program of the shape can be faster than this."""

    @property
    def peak_memory(self) -> float:
        """The most any device keeps, in the stash sizes' unit."""

    @property
    def origin(self) -> str:
        """The candidate it came from: a search policy or a built-in kind."""

    @property
    def best_builtin(self) -> tuple[str, Program, float] | None:
        """
        (name, program, makespan) of the fastest built-in schedule that fits the limit; None when none does.
        """

    @property
    def evaluated(self) -> int:
        """Programs simulated by the search."""

    def __repr__(self) -> str: ...

class Comms:
    """
    A program with its communication as PyTorch's compute_comms rows hold it: each rank's sends, receives and waits between its compute actions.
    """

    @property
    def program(self) -> Program:
        """The compute actions alone."""

    @property
    def rows(self) -> list[list[str]]:
        """
        Each rank's row as PyTorch's action strings: '0F1', '0SEND_F1', '1RECV_F1', '0WAIT_SEND_F1'.
        """

    def to_csv(self) -> str:
        """
        The rows in PyTorch's CSV format, for _load_csv(..., format='compute_comms').
        """

    def __str__(self) -> str: ...

    def __eq__(self, arg: Comms, /) -> bool: ...

    def __repr__(self) -> str: ...

    __hash__: None = None

class CommsProof:
    """
    prove_comms()'s outcome: true when the rows cannot hang; otherwise the rank and the index of the field in its row, and what is wrong: for a hang, each blocked rank's wait and the cycle of waits.
    """

    @property
    def ok(self) -> bool: ...

    @property
    def rank(self) -> int:
        """The rank of the problem, -1 when it belongs to none."""

    @property
    def index(self) -> int:
        """The field of its row, -1 when it belongs to none."""

    @property
    def message(self) -> str:
        """'ok', or what is wrong."""

    def __bool__(self) -> bool: ...

    def __str__(self) -> str: ...

    def __repr__(self) -> str: ...

def with_comms(program: Program, receives: str = 'early') -> Comms:
    """
    The program with its sends, receives and waits placed for PyTorch's runtime: each send right after the step that makes its tensor, a pair of ranks' messages in one order on both sides, each receive as early as that order allows (receives='early', the default: just after the rank's previous send to its sender in that order; 'late': just before the step that reads it where it can), a REDUCE_GRAD per stage where the program has none (PyTorch's runtime scales the gradients there); proved under the 'pair' and 'async' semantics before it is returned.

    >>> print(pipeweave.with_comms(pipeweave.schedule('1f1b', 2, 1, 1)), end='')
    0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD
    1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD,1WAIT_REDUCE_GRAD,1WAIT_SEND_B0
    """

def parse_comms(text: str) -> Comms:
    """
    compute_comms rows from PyTorch's CSV text, the sends, receives and waits as written (PyTorch's _dump_csv(..., format='compute_comms')).
    """

def load_comms(path: str | os.PathLike) -> Comms:
    """parse_comms() of a file."""

def prove_comms(comms: Comms, semantics: str = 'pair') -> CommsProof:
    """
    Proves that the rows cannot hang, or names the hang. semantics: 'async' (gloo-like: a send never blocks, a compute waits for the receives it reads), 'pair' (NCCL-like: a rank's sends and receives with one peer complete in the order posted, a send when its receive is reached), or 'rank' (one stream per rank: all of a rank's sends and receives in the order posted).
    """

def kinds() -> list[str]:
    """The names of the generated schedules, for schedule()."""

def schedule(kind: str, devices: int, chunks: int | None, micro_batches: int, placement: str | None = None) -> Program:
    """
    The program of a generated schedule, in exactly PyTorch's order: kind one of kinds(); chunks None for the kind's own (1, or 2 for the v-shaped ones); placement None for the kind's own. Raises Error stating the rule a shape breaks.

    >>> pipeweave.schedule('interleaved', 4, 2, 8)
    <pipeweave.Program Interleaved 1F1B: P=4 devices, V=2 chunks, M=8 micro-batches>
    """

def verify(program: Program) -> Verification:
    """
    Proves a program: no deadlock, every dependency met, the memory rules kept. The result is true when it holds and names the first violation otherwise.
    """

def lower(program: Program) -> Lowered:
    """
    Lowers a program to the steps a runtime issues (sends and receives placed), proving it on the way; raises Error with verify()'s message when it does not hold.
    """

def simulate(program: Program, costs: Costs | None = None) -> Trace:
    """
    Runs a program on the simulator under the costs (default: F 1, I 1, W 1, free transfers).
    """

def synthesize(devices: int, chunks: int, micro_batches: int, costs: Costs | None = None, *, memory_limit: float = 0.0, placement: str = 'loop', recompute: bool = False, offload: bool = False, split_backward: bool = True, pairs: bool = True, work: int = 0) -> Synthesis:
    """
    The fastest proven program the search finds for the costs under a memory limit (each device's peak memory, in the stash sizes' unit; 0: none), against every built-in schedule that fits. recompute, offload: micro-batches may be recomputed, stashes offloaded, to meet the limit; split_backward, pairs: I/W halves and overlapped pairs may be used; work: the search's budget in simulated actions (0: the default, about 0.5 s at P 8, V 2, M 64).
    """

def smallest_memory_limit(devices: int, chunks: int, micro_batches: int, *, placement: str = 'loop', recompute: bool = False, costs: Costs | None = None) -> float:
    """
    The smallest memory limit any program of the shape fits in (synthesize() refuses less).
    """

def with_grad_reduce(program: Program) -> Program:
    """
    The program with each chunk's gradient all-reduce (REDUCE_GRAD) after the chunk's last backward on its device: data parallelism around the pipeline.
    """

def overlap(program: Program) -> Program:
    """
    The program with its steady phase fused into overlapped pairs, a forward and an independent backward that run at once.
    """

def with_recompute(program: Program, stages: object) -> Program:
    """
    The program with the given virtual stages (a list, or 'all') recomputing every micro-batch: each keeps only its input from its forward to a recomputation right before its backward.
    """

def with_offload(program: Program, stages: object) -> Program:
    """
    The program with the given virtual stages (a list, or 'all') offloading their stashes to host memory after the forward and reloading them before the backward, on each device's copy lane.
    """

def parse_csv(text: str) -> Program:
    """
    A program from PyTorch's pipelining CSV text (one row per rank); the shape is inferred, the kind 'custom'. Communication actions (SEND_F, RECV_B, ...) are checked for form and skipped: lower() places them. Raises Error naming the line and column of a bad field.
    """

def load_csv(path: str | os.PathLike) -> Program:
    """parse_csv() of a file."""

def to_csv(program: Program) -> str:
    """
    The program in PyTorch's pipelining CSV format (compute actions; _load_csv(..., format='compute_only')).
    """

def to_cpp(program: Program, name: str = 'Schedule') -> str:
    """
    The program as a C++ header whose struct `name` static_assert(pipeweave::verify(...)) proves at compile time.
    """
