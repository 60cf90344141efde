"""The mean: the algorithm's own weighted average of the uploads, as without an aggregation rule."""
from rayfed.aggregation.base import register_rule


@register_rule("mean")
def mean(aggregation) -> None:
    """The algorithm's own weighted average (algorithm.agg_weighting, the selector's weights): no rule in between."""
    return None
