"""The public surface for tallow plugins.

A plugin imports from here (and from :mod:`tallow.layers`, :mod:`tallow.kernels`) and nothing
else of tallow. It implements hooks marked with :data:`hookimpl` in a module named by its
``tallow`` entry point.
"""

from .calibration import CalibrationRequest
from .components import (
    AttentionBackend, Checkpoint, Component, KVCodec, KVTensor, ModelArchitecture, QuantScheme,
    ToolProvider, ToolResult, WeightFormat, check_tool_provider_status,
)
from .embedding_spec import EmbeddingSpec
from .errors import ComponentLoadError, PluginError, PluginLoadError
from .grammar import (
    GRAMMAR_KINDS, GrammarBackend, GrammarError, GrammarMatcher, GrammarSpec, TokenizerInfo,
    bitmask_words,
)
from .hookspecs import hookimpl, hookspec
from .model_files import ModelFileError
from .registry import (
    ArchitectureRegistry, AttentionBackendRegistry, Entry, GrammarBackendRegistry, KVCodecRegistry,
    QuantSchemeRegistry, ReasoningParserRegistry, Registries, Registry, RegistryError,
    RouteRegistry, SpeculatorRegistry, ToolParserRegistry, ToolProviderRegistry, WeightFormatRegistry, registering_as,
)
from .reasoning import (
    ReasoningParser, ReasoningSplit, ReasoningStream, TagReasoningParser, TagReasoningStream,
)
from .speculator import Proposal, SpeculationContext, Speculator
from .selection import SelectionError, select, serving
from .settings import PluginSettingsError, plugin_settings
from .tool_parsing import (
    CallRegion, Decision, FoundCall, MarkupToolParser, ParseResult, StreamDelta,
    StreamingToolParser, ToolCall, ToolCallDelta, ToolParser, assemble, choose_tool_parser,
    new_call_id, tool_schemas, validate_tool_call,
)

__all__ = [
    "hookimpl", "hookspec",
    "CalibrationRequest", "Component", "Checkpoint", "EmbeddingSpec", "WeightFormat",
    "ModelArchitecture", "QuantScheme", "KVCodec", "KVTensor",
    "AttentionBackend", "ToolProvider", "ToolResult", "check_tool_provider_status", "ToolParser", "StreamingToolParser", "ToolCall",
    "ToolCallDelta", "StreamDelta", "ParseResult", "new_call_id", "validate_tool_call",
    "tool_schemas", "assemble", "choose_tool_parser", "MarkupToolParser", "CallRegion",
    "Decision", "FoundCall", "ReasoningParser", "ReasoningSplit", "ReasoningStream",
    "TagReasoningParser", "TagReasoningStream", "ReasoningParserRegistry",
    "Registry", "Registries", "Entry", "RegistryError", "ArchitectureRegistry",
    "WeightFormatRegistry", "QuantSchemeRegistry", "KVCodecRegistry", "AttentionBackendRegistry",
    "ToolParserRegistry", "ToolProviderRegistry", "RouteRegistry", "GrammarBackendRegistry",
    "registering_as", "GRAMMAR_KINDS", "GrammarBackend", "GrammarError", "GrammarMatcher",
    "GrammarSpec", "TokenizerInfo", "bitmask_words",
    "Speculator", "Proposal", "SpeculationContext", "SpeculatorRegistry",
    "select", "serving", "SelectionError", "PluginSettingsError", "plugin_settings", "ModelFileError",
    "PluginError", "PluginLoadError", "ComponentLoadError",
]
