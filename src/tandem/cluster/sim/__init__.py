"""`tandem simulate`: a discrete-event simulation of a speculative-decoding cluster.

Devices with cost curves, verifier replicas with their drafters, network round trips, request
arrivals and acceptance go in (config.py); throughput, latency percentiles, utilisation, mean k
and acceptance come out (metrics.py). The step it simulates is the engine's (step.py); the
depth planner is the engine's own (planning.py). reference.py keeps a slow, step-by-step
simulation of the one-sequence case, with its closed form, to test the fast one against.
"""

from tandem.cluster.sim.acceptance import EmpiricalAcceptance, GeometricAcceptance
from tandem.cluster.sim.config import Device, Network, SimDepth, SimDrafter, Simulation, Verifier, Workload
from tandem.cluster.sim.lengths import EmpiricalLengths, FixedLength
from tandem.cluster.sim.metrics import SimResult
from tandem.cluster.sim.simulator import simulate

__all__ = [
    "Device", "EmpiricalAcceptance", "EmpiricalLengths", "FixedLength", "GeometricAcceptance", "Network",
    "SimDepth", "SimDrafter", "SimResult", "Simulation", "Verifier", "Workload", "simulate",
]
