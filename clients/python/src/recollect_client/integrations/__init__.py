"""Framework integrations, each behind an optional extra so the core client needs neither:

* :mod:`recollect_client.integrations.langchain` (``[langchain]``): ``RecollectChatMessageHistory``
  and ``RecollectRetriever``.
* :mod:`recollect_client.integrations.llama_index` (``[llamaindex]``): ``RecollectMemoryBlock`` for
  llama-index-core's ``Memory``.
"""
