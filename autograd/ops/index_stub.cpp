namespace tg {
void link_index_ops() {}
}
