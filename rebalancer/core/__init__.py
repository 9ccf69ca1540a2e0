"""The pure decision core: values in, values out; no I/O, no clock, no event loop.

Modules, in the order a tick uses them: ``model`` (the vocabulary), ``keys`` and ``nodestate``
(what lives on a Node), ``windows`` and ``overrides`` (what operators say), ``capacity``
(what a node serves when full, measured from history), ``planning`` (the safety rules that
turn a strategy's proposal into steps and rejections).
"""
