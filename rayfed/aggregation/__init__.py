"""Aggregation rules (aggregation.rule): how the server combines the round's uploads before the
algorithm's server step reads them. The robust rules, one small module each, register themselves like
a plugin's would; bucketing (aggregation.bucket_size) applies to any of them."""
from rayfed.aggregation.base import REQUIRED, RULE_KEYS, Rule, build_rule, register_rule
from rayfed.aggregation.combined import RobustUploads, bucket_means, combine
from rayfed.registry import import_submodules

import_submodules(__name__, __path__)

__all__ = ["REQUIRED", "RULE_KEYS", "Rule", "RobustUploads", "bucket_means", "build_rule", "combine", "register_rule"]
