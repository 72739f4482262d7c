"""The course's knowledge agent on any rung: plan → retrieve → chained actions, every call traced.

``actions`` is the registry and the planner's prompt, ``retrieval`` reads and embeds the
documents, ``run`` runs one task through ``options.contract`` and keeps its trace, ``target``
says where the calls go. Run it as ``python -m options.agent``; price its trace with
``python -m cost agent --trace FILE``.
"""
