"""The two nodes and what crosses between them: commands over ssh, docker on either node,
resumable copies, the model fetch, and a node's memory pressure."""
