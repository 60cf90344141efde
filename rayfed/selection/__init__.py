"""Client selection: whom the server trains each round and with what aggregation weights
(FedMoS, Wang et al., INFOCOM 2023, Sec. IV). Pure numpy; the server calls it with the clients that are online."""
from rayfed.selection.clusters import ClientOrder, cluster_order, cosine_similarities
from rayfed.selection.selectors import Selection, SelectionRequest, register_selector, select
from rayfed.selection.table import acs_order, acs_table

__all__ = ["SelectionRequest", "register_selector", "ClientOrder", "Selection", "cluster_order", "cosine_similarities", "select", "acs_order", "acs_table"]
