namespace tg {
void link_shape_ops() {}
}
