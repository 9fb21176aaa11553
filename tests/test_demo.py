"""What `eagle3-hf demo` prints of the rounds (the command itself runs in test_shipped_head.py)."""

from eagle3_hf.commands.demo import describe_shapes, describe_threads
from eagle3_hf.generation.cost_model import PLAIN_STEP, TreeShape


def test_the_shapes_chosen_most_frequent_first():
    shapes = [TreeShape(8, 3), PLAIN_STEP, TreeShape(8, 3), TreeShape(16, 4)]
    assert describe_shapes(shapes) == "2 rounds 8 nodes / depth 3, 1 plain steps, 1 rounds 16 nodes / depth 4"


def test_rounds_on_fewer_threads_than_the_callers_are_named_and_none_say_nothing():
    assert describe_threads([2, 1, 1, 2, 4], callers=4) == "; 2 rounds on 1 thread, 2 rounds on 2 threads"
    assert describe_threads([2, 2], callers=2) == "" and describe_threads(None, callers=2) == ""
