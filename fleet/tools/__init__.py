"""Tools: a registry built from typed functions, file/shell/web/skill tools."""
