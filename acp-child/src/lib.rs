//! acp-child: an ACP agent server on stdio (in progress).
