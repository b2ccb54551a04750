"""`tandem serve` moves what loading left out of the collector's reach before it serves."""

import gc

from tandem.serve.server import settle_heap


def test_what_loading_left_is_frozen_and_its_garbage_collected():
    gc.unfreeze()
    gc.disable()  # no collection of its own may free the cycle before settle_heap does
    try:
        cycle = [[]]
        cycle[0].append(cycle)
        collected_before = gc.get_stats()[2]["collected"]
        del cycle
        settle_heap()
        assert gc.get_freeze_count() > 0
        assert gc.get_stats()[2]["collected"] > collected_before  # the garbage went first, not frozen
    finally:
        gc.unfreeze()
        gc.enable()
