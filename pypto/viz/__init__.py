"""Drawing: graphviz views of the IR levels, the timeline swimlane and the ipywidgets explorer.

The heavy libraries (graphviz, matplotlib, ipywidgets) are imported inside the functions that
use them, so importing this package stays cheap and works without them installed.
"""
from .explorer import Explorer
from .views import stats_html
from .graphs import block_graph, exec_graph, level_graph, tensor_graph, tile_graph, to_svg
from .timeline import plot_timeline, timeline_png

__all__ = ["Explorer", "block_graph", "exec_graph", "level_graph", "plot_timeline", "stats_html",
           "tensor_graph", "tile_graph", "timeline_png", "to_svg"]
